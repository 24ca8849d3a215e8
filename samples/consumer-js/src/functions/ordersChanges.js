'use strict';
// The queue-triggered function (Azure Functions Node.js programming model v4): one message per change that
// sql-pseudo-trigger's function wrote to the `orders-changes` queue. The logic is in ../changes.js.
const { app } = require('@azure/functions');
const { ChangeError, MemoryStore, applyChange, optionsFromEnv } = require('../changes');

// In memory so the sample runs as it is; each instance then has its own copy. Replace it with your database
// (README: a guarded upsert per change) before relying on it.
const store = new MemoryStore();
const options = optionsFromEnv();

app.storageQueue('ordersChanges', {
  queueName: 'orders-changes',
  connection: 'AzureWebJobsStorage',
  handler: (message, context) => {
    try {
      const r = applyChange(store, message, options);
      // Keys and versions only: never row values.
      context.log(`${r.operation} ${r.key} version ${r.version ?? '-'}: ${r.outcome}`);
    } catch (e) {
      // Thrown, the message is retried and after maxDequeueCount (host.json) moved to orders-changes-poison.
      if (e instanceof ChangeError) context.error(`cannot apply message ${context.triggerMetadata?.id}: ${e.message}`);
      throw e;
    }
  },
});
