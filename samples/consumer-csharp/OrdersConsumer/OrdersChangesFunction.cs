// The queue-triggered function: one message per change that sql-pseudo-trigger's function wrote to the
// `orders-changes` queue. The logic is in ChangeApplier.cs.
using Microsoft.Azure.Functions.Worker;
using Microsoft.Extensions.Logging;

namespace OrdersConsumer;

public sealed class OrdersChangesFunction(IChangeStore store, ChangeOptions options, ILogger<OrdersChangesFunction> logger)
{
    [Function("OrdersChanges")]
    public void Run([QueueTrigger("orders-changes", Connection = "AzureWebJobsStorage")] string message, FunctionContext context)
    {
        ApplyResult r;
        try
        {
            r = ChangeApplier.Apply(store, message, options);
        }
        catch (ChangeException e)
        {
            // Thrown, the message is retried and after maxDequeueCount (host.json) moved to orders-changes-poison.
            context.BindingContext.BindingData.TryGetValue("Id", out var id);
            logger.LogError("cannot apply message {MessageId}: {Reason}", id, e.Message);
            throw;
        }
        // Keys and versions only: never row values.
        logger.LogInformation("{Operation} {Key} version {Version}: {Outcome}", r.Operation, r.Key, r.Version?.ToString() ?? "-", r.Outcome);
    }
}
