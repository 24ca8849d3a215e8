'use strict';
/**
 * Applying sql-pseudo-trigger's changes idempotently. No dependency on the Functions runtime, so that
 * `node --test` checks it anywhere; src/functions/ordersChanges.js wires it to a queue trigger.
 *
 * Each queue message is one change, `{"Operation": 0|1|2, "Item": {...row...}}` (Insert, Update, Delete; a
 * delete's Item holds only the primary key). Delivery is at-least-once, so the same change can arrive twice,
 * and queue-triggered functions run several messages at once, so a re-delivered older change can arrive
 * after a newer one. The rules:
 *
 * - every change is an upsert (or a delete) by key, never a blind insert: a duplicate changes nothing;
 * - when the row carries a version (PostgreSQL sources: the xid8 cursor column, e.g. `version`, sent as a
 *   string), a change at or below the version already applied is ignored;
 * - a delete leaves a tombstone that keeps the newest version seen, so a re-delivered insert or update of
 *   that version (or older) does not bring the row back; a genuinely new insert has a higher version;
 * - without a version the last change to arrive wins: duplicates are still harmless, but order between
 *   different changes of one key is then whatever order the messages were processed in.
 */

const OPERATIONS = new Map([
  [0, 'insert'], [1, 'update'], [2, 'delete'],
  ['insert', 'insert'], ['update', 'update'], ['delete', 'delete'],
]);

/** A message that can never be applied: throw it so the host retries, then moves it to the poison queue. */
class ChangeError extends Error {}

/** Finds `name` among an object's own keys ignoring case (the Functions host may re-case nothing, but
 * hand-written test messages and other producers do). */
function field(obj, name) {
  const lower = name.toLowerCase();
  const key = Object.keys(obj).find((k) => k.toLowerCase() === lower);
  return key === undefined ? undefined : obj[key];
}

/**
 * The change in a queue message: `{ operation: 'insert'|'update'|'delete', item }`. Accepts the message as
 * the Node.js worker hands it over (already parsed when it was JSON), or as text or bytes: the host writes
 * each message as indented JSON (Newtonsoft's ToString()), which JSON.parse reads like any other.
 */
function parseChange(message) {
  let value = message;
  if (Buffer.isBuffer(value)) value = value.toString('utf8');
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch (e) {
      throw new ChangeError(`the queue message is not JSON (${e.message}); expected {"Operation":0,"Item":{...}}`);
    }
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ChangeError('the queue message is not a JSON object; expected {"Operation":0,"Item":{...}}');
  }
  const op = field(value, 'Operation');
  const operation = OPERATIONS.get(typeof op === 'string' ? op.toLowerCase() : op);
  if (operation === undefined) {
    throw new ChangeError(`Operation is ${JSON.stringify(op)}; expected 0 (insert), 1 (update) or 2 (delete)`);
  }
  const item = field(value, 'Item');
  if (item === null || typeof item !== 'object' || Array.isArray(item)) {
    throw new ChangeError('Item is missing or not an object; expected the row (or, for a delete, its key)');
  }
  return { operation, item };
}

/** The row's identity: the values of the key fields, as one string usable as a Map key. */
function keyOf(item, keyFields) {
  const values = keyFields.map((name) => {
    const v = item[name];
    if (v === undefined || v === null) {
      throw new ChangeError(
        `Item has no key field ${JSON.stringify(name)} (it has ${Object.keys(item).join(', ')}); ` +
          'set ORDERS_KEY_FIELDS to the table\'s primary key columns',
      );
    }
    return v;
  });
  return JSON.stringify(values);
}

/**
 * The row's version as a BigInt, or null when the version field is unset or absent (deletes never carry
 * it). xid8 values exceed 2^53, so they arrive as strings and are compared as integers, never as text.
 */
function versionOf(item, versionField) {
  if (!versionField) return null;
  const v = item[versionField];
  if (v === undefined || v === null) return null;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt(v);
  if (typeof v === 'string' && /^-?\d+$/.test(v.trim())) return BigInt(v.trim());
  throw new ChangeError(
    `version field ${JSON.stringify(versionField)} holds ${JSON.stringify(v)}, not an integer ` +
      '(an xid8 or bigint column); point ORDERS_VERSION_FIELD at one, or set it empty to go without versions',
  );
}

/** Key order does not matter when deciding whether an unversioned item is a repeat of the stored one. */
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * What one change does to the stored record of its key: `{ outcome, record }`, where record is what to
 * store (null: store nothing). Outcomes: applied, deleted, duplicate (already applied), stale (older than
 * what is stored). A record is `{ item, version, deleted }`; a deleted record is a tombstone.
 */
function decide(existing, change) {
  const { operation, item, version } = change;
  if (operation === 'delete') {
    if (existing && existing.deleted) return { outcome: 'duplicate', record: null };
    // A delete carries no version: the tombstone keeps the newest one seen, so anything at or below it that
    // is delivered again stays ignored.
    return { outcome: 'deleted', record: { item: null, version: existing ? existing.version : null, deleted: true } };
  }
  if (existing && version !== null && existing.version !== null) {
    if (version < existing.version) return { outcome: 'stale', record: null };
    if (version === existing.version) return { outcome: existing.deleted ? 'stale' : 'duplicate', record: null };
  }
  if (existing && !existing.deleted && version === null && canonical(existing.item) === canonical(item)) {
    return { outcome: 'duplicate', record: null };
  }
  return { outcome: 'applied', record: { item, version, deleted: false } };
}

/**
 * Rows in memory, for the tests and for trying the sample. A real store must make `update` atomic per key:
 * a transaction, or one guarded statement (README: INSERT ... ON CONFLICT ... WHERE t.version < excluded.version).
 */
class MemoryStore {
  constructor() {
    this.records = new Map();
  }

  /** Reads the key's record, lets `fn` decide, writes its record: synchronously, so nothing interleaves. */
  update(key, fn) {
    const { outcome, record } = fn(this.records.get(key));
    if (record) this.records.set(key, record);
    return outcome;
  }

  /** The live rows (tombstones left out). */
  rows() {
    return [...this.records.values()].filter((r) => !r.deleted).map((r) => r.item);
  }
}

/**
 * Applies one queue message to `store`. Options: keyFields (the primary key columns, default ['id']) and
 * versionField (default 'version'; '' or null: no versions). Returns `{ outcome, key, operation, version }`
 * for logging (never log row values). Throws ChangeError for a message that can never be applied.
 */
function applyChange(store, message, options = {}) {
  const keyFields = options.keyFields ?? ['id'];
  const versionField = options.versionField === undefined ? 'version' : options.versionField;
  const { operation, item } = parseChange(message);
  const key = keyOf(item, keyFields);
  const version = operation === 'delete' ? null : versionOf(item, versionField);
  const outcome = store.update(key, (existing) => decide(existing, { operation, item, version }));
  return { outcome, key, operation, version: version === null ? null : version.toString() };
}

/** Options from app settings: ORDERS_KEY_FIELDS (comma-separated, default id), ORDERS_VERSION_FIELD
 * (default version; set it empty for a source without a version column). */
function optionsFromEnv(env = process.env) {
  return {
    keyFields: (env.ORDERS_KEY_FIELDS || 'id').split(',').map((s) => s.trim()).filter(Boolean),
    versionField: env.ORDERS_VERSION_FIELD === undefined ? 'version' : env.ORDERS_VERSION_FIELD.trim(),
  };
}

module.exports = { ChangeError, MemoryStore, applyChange, decide, optionsFromEnv, parseChange };
