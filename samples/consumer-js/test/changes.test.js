'use strict';
// The idempotency contract of src/changes.js, message by message as the queue would deliver them.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { ChangeError, MemoryStore, applyChange, optionsFromEnv } = require('../src/changes');

const insert = (id, version, extra = {}) => ({ Operation: 0, Item: { id, customer: 'ada', amount: 12.5, version, ...extra } });
const update = (id, version, extra = {}) => ({ Operation: 1, Item: { id, customer: 'ada', amount: 20.0, version, ...extra } });
const del = (id) => ({ Operation: 2, Item: { id } });

// What the Functions host writes to the queue: each change's Newtonsoft ToString(), indented, CRLF line ends.
function asHostWritesIt(change) {
  return JSON.stringify(change, null, 2).replace(/\n/g, '\r\n');
}

test('a change delivered twice is applied once', () => {
  const store = new MemoryStore();
  assert.equal(applyChange(store, insert(1, '100')).outcome, 'applied');
  assert.equal(applyChange(store, insert(1, '100')).outcome, 'duplicate');
  assert.deepEqual(store.rows(), [insert(1, '100').Item]);
});

test('an older version arriving after a newer one is ignored', () => {
  const store = new MemoryStore();
  applyChange(store, insert(1, '100'));
  applyChange(store, update(1, '105'));
  assert.equal(applyChange(store, insert(1, '100')).outcome, 'stale');
  assert.deepEqual(store.rows(), [update(1, '105').Item]);
});

test('versions are compared as integers, not as text (xid8 values arrive as strings)', () => {
  const store = new MemoryStore();
  applyChange(store, update(1, '10'));
  assert.equal(applyChange(store, update(1, '9')).outcome, 'stale');
  assert.equal(applyChange(store, update(1, '18446744073709551615')).outcome, 'applied');
  assert.equal(applyChange(store, update(1, 11)).outcome, 'stale');
});

test('an insert delivered again after its delete leaves the row deleted', () => {
  const store = new MemoryStore();
  applyChange(store, insert(1, '100'));
  assert.equal(applyChange(store, del(1)).outcome, 'deleted');
  assert.equal(applyChange(store, insert(1, '100')).outcome, 'stale');
  assert.deepEqual(store.rows(), []);
});

test('a delete delivered twice is a duplicate, and a new insert of the key (higher version) brings it back', () => {
  const store = new MemoryStore();
  applyChange(store, insert(1, '100'));
  applyChange(store, del(1));
  assert.equal(applyChange(store, del(1)).outcome, 'duplicate');
  assert.equal(applyChange(store, insert(1, '200')).outcome, 'applied');
  assert.deepEqual(store.rows(), [insert(1, '200').Item]);
});

test('a message as the host writes it (indented JSON text, or its bytes) parses', () => {
  const store = new MemoryStore();
  const text = asHostWritesIt(insert(7, '300'));
  assert.match(text, /\r\n {2}"Operation": 0/);
  assert.equal(applyChange(store, text).outcome, 'applied');
  assert.equal(applyChange(store, Buffer.from(text)).outcome, 'duplicate');
  assert.equal(applyChange(store, asHostWritesIt(del(7))).outcome, 'deleted');
});

test('a message the Node.js worker already parsed (an object) is accepted', () => {
  const store = new MemoryStore();
  assert.equal(applyChange(store, JSON.parse(asHostWritesIt(update(2, '5')))).outcome, 'applied');
});

test('without a version field the last change wins and an exact repeat is a duplicate', () => {
  const options = { versionField: '' };
  const store = new MemoryStore();
  applyChange(store, { Operation: 0, Item: { id: 1, customer: 'ada', amount: 12.5 } }, options);
  assert.equal(applyChange(store, { Operation: 1, Item: { id: 1, customer: 'ada', amount: 20.0 } }, options).outcome, 'applied');
  // The same row with its properties in another order is the same row.
  const reordered = { Item: { amount: 20.0, customer: 'ada', id: 1 }, Operation: 1 };
  assert.equal(applyChange(store, reordered, options).outcome, 'duplicate');
  assert.deepEqual(store.rows(), [{ id: 1, customer: 'ada', amount: 20.0 }]);
});

test('without versions an insert delivered again after its delete brings the row back (the documented limit)', () => {
  const options = { versionField: null };
  const store = new MemoryStore();
  applyChange(store, insert(1, '100'), options);
  applyChange(store, del(1), options);
  assert.equal(applyChange(store, insert(1, '100'), options).outcome, 'applied');
  assert.equal(store.rows().length, 1);
});

test('composite keys identify a row by all their fields', () => {
  const options = { keyFields: ['tenant', 'id'] };
  const store = new MemoryStore();
  applyChange(store, insert(1, '1', { tenant: 'a' }), options);
  applyChange(store, insert(1, '1', { tenant: 'b' }), options);
  applyChange(store, { Operation: 2, Item: { tenant: 'a', id: 1 } }, options);
  assert.deepEqual(store.rows().map((r) => r.tenant), ['b']);
});

test('a message that can never be applied throws a ChangeError naming the problem', () => {
  const store = new MemoryStore();
  assert.throws(() => applyChange(store, 'not json'), (e) => e instanceof ChangeError && /not JSON/.test(e.message));
  assert.throws(() => applyChange(store, '[1,2]'), /not a JSON object/);
  assert.throws(() => applyChange(store, { Operation: 3, Item: { id: 1 } }), /Operation is 3/);
  assert.throws(() => applyChange(store, { Operation: 0 }), /Item is missing/);
  assert.throws(() => applyChange(store, { Operation: 0, Item: { Id: 1 } }), /no key field "id" \(it has Id\)/);
  assert.throws(() => applyChange(store, insert(1, '1.5')), /not an integer/);
  assert.throws(() => applyChange(store, insert(1, 2 ** 60)), /not an integer/);
  assert.deepEqual(store.rows(), []);
});

test('options come from ORDERS_KEY_FIELDS and ORDERS_VERSION_FIELD', () => {
  assert.deepEqual(optionsFromEnv({}), { keyFields: ['id'], versionField: 'version' });
  assert.deepEqual(optionsFromEnv({ ORDERS_KEY_FIELDS: 'tenant, id', ORDERS_VERSION_FIELD: '' }), {
    keyFields: ['tenant', 'id'],
    versionField: '',
  });
});
