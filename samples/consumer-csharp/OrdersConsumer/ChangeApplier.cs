// Applying sql-pseudo-trigger's changes idempotently, with no dependency on the Functions worker so that the
// tests (OrdersConsumer.Tests) exercise it directly.
//
// Each queue message is one change, {"Operation": 0|1|2, "Item": {...row...}} (Insert, Update, Delete; a
// delete's Item holds only the primary key). Delivery is at-least-once, so the same change can arrive twice,
// and queue-triggered functions run several messages at once, so a re-delivered older change can arrive after
// a newer one. The rules:
// - every change is an upsert (or a delete) by key, never a blind insert: a duplicate changes nothing;
// - when the row carries a version (PostgreSQL sources: the xid8 cursor column, e.g. "version", sent as a
//   string), a change at or below the version already applied is ignored;
// - a delete leaves a tombstone that keeps the newest version seen, so a re-delivered insert or update of that
//   version (or older) does not bring the row back; a genuinely new insert has a higher version;
// - without a version the last change to arrive wins: duplicates are still harmless, but order between
//   different changes of one key is then whatever order the messages were processed in.
using System.Numerics;
using System.Text.Json;
using System.Text.Json.Nodes;

namespace OrdersConsumer;

public enum Operation { Insert = 0, Update = 1, Delete = 2 }

/// <summary>A message that can never be applied: thrown so the host retries, then moves it to the poison queue.</summary>
public sealed class ChangeException(string message) : Exception(message);

/// <summary>What a store keeps per key. A deleted record is a tombstone: no item, the newest version seen.</summary>
public sealed record StoredRecord(JsonObject? Item, BigInteger? Version, bool Deleted);

/// <summary>What one change does: an outcome (applied, deleted, duplicate, stale) and the record to store, if any.</summary>
public readonly record struct Decision(string Outcome, StoredRecord? Record);

/// <summary>The outcome of one message, with keys and versions only: log it, never rows.</summary>
public sealed record ApplyResult(string Outcome, string Key, Operation Operation, BigInteger? Version);

/// <summary>
/// Where rows go. <see cref="Update"/> must be atomic per key (read, decide, write): a transaction, or one
/// guarded statement (samples/README.md: INSERT ... ON CONFLICT ... WHERE t.version &lt; excluded.version).
/// </summary>
public interface IChangeStore
{
    string Update(string key, Func<StoredRecord?, Decision> decide);
}

/// <summary>Rows in memory, for the tests and for trying the sample.</summary>
public sealed class MemoryChangeStore : IChangeStore
{
    private readonly Dictionary<string, StoredRecord> _records = new();
    private readonly object _lock = new();

    public string Update(string key, Func<StoredRecord?, Decision> decide)
    {
        lock (_lock)
        {
            _records.TryGetValue(key, out var existing);
            var decision = decide(existing);
            if (decision.Record is not null)
            {
                _records[key] = decision.Record;
            }
            return decision.Outcome;
        }
    }

    /// <summary>The live rows (tombstones left out).</summary>
    public IReadOnlyList<JsonObject> Rows()
    {
        lock (_lock)
        {
            return _records.Values.Where(r => !r.Deleted && r.Item is not null).Select(r => r.Item!).ToList();
        }
    }
}

/// <summary>The table's primary key columns, and the version column ("" or null: no versions).</summary>
public sealed record ChangeOptions(IReadOnlyList<string> KeyFields, string? VersionField)
{
    public static ChangeOptions Default { get; } = new(new[] { "id" }, "version");

    /// <summary>ORDERS_KEY_FIELDS (comma-separated, default id), ORDERS_VERSION_FIELD (default version; set it
    /// empty for a source without a version column).</summary>
    public static ChangeOptions FromEnvironment()
    {
        var keys = Environment.GetEnvironmentVariable("ORDERS_KEY_FIELDS");
        var version = Environment.GetEnvironmentVariable("ORDERS_VERSION_FIELD");
        var keyFields = string.IsNullOrWhiteSpace(keys)
            ? new[] { "id" }
            : keys.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries);
        return new ChangeOptions(keyFields, version is null ? "version" : version.Trim());
    }
}

public static class ChangeApplier
{
    private const string Expected = "expected {\"Operation\":0,\"Item\":{...}}";

    /// <summary>Applies one queue message to the store. Throws <see cref="ChangeException"/> for a message that
    /// can never be applied.</summary>
    public static ApplyResult Apply(IChangeStore store, string message, ChangeOptions options)
    {
        var (operation, item) = Parse(message);
        var key = KeyOf(item, options.KeyFields);
        var version = operation == Operation.Delete ? null : VersionOf(item, options.VersionField);
        var outcome = store.Update(key, existing => Decide(existing, operation, item, version));
        return new ApplyResult(outcome, key, operation, version);
    }

    /// <summary>The change in a message. The host writes each message as indented JSON (Newtonsoft's
    /// ToString()), which JsonNode.Parse reads like any other.</summary>
    public static (Operation Operation, JsonObject Item) Parse(string message)
    {
        JsonNode? node;
        try
        {
            node = JsonNode.Parse(message);
        }
        catch (JsonException e)
        {
            throw new ChangeException($"the queue message is not JSON ({e.Message}); {Expected}");
        }
        if (node is not JsonObject obj)
        {
            throw new ChangeException($"the queue message is not a JSON object; {Expected}");
        }
        var opNode = Field(obj, "Operation");
        var operation = ReadOperation(opNode);
        if (operation is null)
        {
            throw new ChangeException($"Operation is {opNode?.ToJsonString() ?? "missing"}; expected 0 (insert), 1 (update) or 2 (delete)");
        }
        if (Field(obj, "Item") is not JsonObject item)
        {
            throw new ChangeException("Item is missing or not an object; expected the row (or, for a delete, its key)");
        }
        return (operation.Value, item);
    }

    /// <summary>The row's identity: the values of the key fields, as one JSON array text.</summary>
    public static string KeyOf(JsonObject item, IReadOnlyList<string> keyFields)
    {
        var values = new JsonArray();
        foreach (var name in keyFields)
        {
            if (!item.TryGetPropertyValue(name, out var value) || value is null)
            {
                throw new ChangeException(
                    $"Item has no key field \"{name}\" (it has {string.Join(", ", item.Select(p => p.Key))}); set ORDERS_KEY_FIELDS to the table's primary key columns");
            }
            values.Add(value.DeepClone());
        }
        return values.ToJsonString();
    }

    /// <summary>The row's version, or null when the field is unset or absent (deletes never carry it). xid8
    /// values arrive as strings and are compared as integers, never as text.</summary>
    public static BigInteger? VersionOf(JsonObject item, string? versionField)
    {
        if (string.IsNullOrEmpty(versionField) || !item.TryGetPropertyValue(versionField, out var node) || node is null)
        {
            return null;
        }
        if (node is JsonValue v)
        {
            if (v.GetValueKind() == JsonValueKind.Number && v.TryGetValue<long>(out var n))
            {
                return n;
            }
            if (v.GetValueKind() == JsonValueKind.String
                && BigInteger.TryParse(v.GetValue<string>().Trim(), System.Globalization.NumberStyles.AllowLeadingSign, System.Globalization.CultureInfo.InvariantCulture, out var big))
            {
                return big;
            }
        }
        throw new ChangeException(
            $"version field \"{versionField}\" holds {node.ToJsonString()}, not an integer (an xid8 or bigint column); point ORDERS_VERSION_FIELD at one, or set it empty to go without versions");
    }

    /// <summary>What one change does to the stored record of its key.</summary>
    public static Decision Decide(StoredRecord? existing, Operation operation, JsonObject item, BigInteger? version)
    {
        if (operation == Operation.Delete)
        {
            if (existing is { Deleted: true })
            {
                return new Decision("duplicate", null);
            }
            // A delete carries no version: the tombstone keeps the newest one seen, so anything at or below it
            // that is delivered again stays ignored.
            return new Decision("deleted", new StoredRecord(null, existing?.Version, true));
        }
        if (existing is not null && version is not null && existing.Version is not null)
        {
            if (version < existing.Version)
            {
                return new Decision("stale", null);
            }
            if (version == existing.Version)
            {
                return new Decision(existing.Deleted ? "stale" : "duplicate", null);
            }
        }
        if (existing is { Deleted: false, Item: not null } && version is null && JsonNode.DeepEquals(existing.Item, item))
        {
            return new Decision("duplicate", null);
        }
        return new Decision("applied", new StoredRecord((JsonObject)item.DeepClone(), version, false));
    }

    /// <summary>0, 1, 2, or their names (any case); null for anything else.</summary>
    private static Operation? ReadOperation(JsonNode? node)
    {
        if (node is not JsonValue value)
        {
            return null;
        }
        if (value.GetValueKind() == JsonValueKind.Number && value.TryGetValue<int>(out var n) && n is >= 0 and <= 2)
        {
            return (Operation)n;
        }
        if (value.GetValueKind() == JsonValueKind.String)
        {
            return value.GetValue<string>().ToLowerInvariant() switch
            {
                "insert" => Operation.Insert,
                "update" => Operation.Update,
                "delete" => Operation.Delete,
                _ => null,
            };
        }
        return null;
    }

    private static JsonNode? Field(JsonObject obj, string name) =>
        obj.FirstOrDefault(p => string.Equals(p.Key, name, StringComparison.OrdinalIgnoreCase)).Value;
}
