// The idempotency contract of ChangeApplier, message by message as the queue would deliver them (the same
// cases as the JavaScript and Python samples' tests).
using System.Text.Json.Nodes;
using OrdersConsumer;
using Xunit;

namespace OrdersConsumer.Tests;

public class ChangeApplierTests
{
    private readonly MemoryChangeStore _store = new();

    private static string Insert(int id, string? version) => Change(0, id, version, 12.5);

    private static string Update(int id, string? version) => Change(1, id, version, 20.0);

    private static string Delete(int id) => new JsonObject { ["Operation"] = 2, ["Item"] = new JsonObject { ["id"] = id } }.ToJsonString();

    private static string Change(int operation, int id, string? version, double amount)
    {
        var item = new JsonObject { ["id"] = id, ["customer"] = "ada", ["amount"] = amount };
        if (version is not null)
        {
            item["version"] = version;
        }
        return new JsonObject { ["Operation"] = operation, ["Item"] = item }.ToJsonString();
    }

    // Each change's Newtonsoft ToString() on the queue: indented, CRLF line ends.
    private static string AsHostWritesIt(string change) =>
        JsonNode.Parse(change)!.ToJsonString(new System.Text.Json.JsonSerializerOptions { WriteIndented = true, NewLine = "\r\n" });

    private string Apply(string message, ChangeOptions? options = null) =>
        ChangeApplier.Apply(_store, message, options ?? ChangeOptions.Default).Outcome;

    [Fact]
    public void A_change_delivered_twice_is_applied_once()
    {
        Assert.Equal("applied", Apply(Insert(1, "100")));
        Assert.Equal("duplicate", Apply(Insert(1, "100")));
        Assert.Single(_store.Rows());
    }

    [Fact]
    public void An_older_version_arriving_after_a_newer_one_is_ignored()
    {
        Apply(Insert(1, "100"));
        Apply(Update(1, "105"));
        Assert.Equal("stale", Apply(Insert(1, "100")));
        Assert.Equal(20.0, _store.Rows().Single()["amount"]!.GetValue<double>());
    }

    [Fact]
    public void Versions_are_compared_as_integers_not_as_text()
    {
        Apply(Update(1, "10"));
        Assert.Equal("stale", Apply(Update(1, "9")));
        Assert.Equal("applied", Apply(Update(1, "18446744073709551615")));
    }

    [Fact]
    public void An_insert_delivered_again_after_its_delete_leaves_the_row_deleted()
    {
        Apply(Insert(1, "100"));
        Assert.Equal("deleted", Apply(Delete(1)));
        Assert.Equal("stale", Apply(Insert(1, "100")));
        Assert.Empty(_store.Rows());
    }

    [Fact]
    public void A_repeated_delete_is_a_duplicate_and_a_newer_insert_brings_the_key_back()
    {
        Apply(Insert(1, "100"));
        Apply(Delete(1));
        Assert.Equal("duplicate", Apply(Delete(1)));
        Assert.Equal("applied", Apply(Insert(1, "200")));
        Assert.Single(_store.Rows());
    }

    [Fact]
    public void A_message_as_the_host_writes_it_parses()
    {
        var text = AsHostWritesIt(Insert(7, "300"));
        Assert.Contains("\r\n  \"Operation\": 0", text);
        Assert.Equal("applied", Apply(text));
        Assert.Equal("duplicate", Apply(text));
        Assert.Equal("deleted", Apply(AsHostWritesIt(Delete(7))));
    }

    [Fact]
    public void Without_a_version_the_last_change_wins_and_an_exact_repeat_is_a_duplicate()
    {
        var options = ChangeOptions.Default with { VersionField = "" };
        Apply(Insert(1, null), options);
        Assert.Equal("applied", Apply(Update(1, null), options));
        Assert.Equal("duplicate", Apply("{\"Item\":{\"amount\":20,\"customer\":\"ada\",\"id\":1},\"Operation\":1}", options));
    }

    [Fact]
    public void Without_versions_an_insert_delivered_again_after_its_delete_comes_back_the_documented_limit()
    {
        var options = ChangeOptions.Default with { VersionField = null };
        Apply(Insert(1, "100"), options);
        Apply(Delete(1), options);
        Assert.Equal("applied", Apply(Insert(1, "100"), options));
        Assert.Single(_store.Rows());
    }

    [Theory]
    [InlineData("not json", "not JSON")]
    [InlineData("[1, 2]", "not a JSON object")]
    [InlineData("{\"Operation\":3,\"Item\":{\"id\":1}}", "Operation is 3")]
    [InlineData("{\"Operation\":true,\"Item\":{\"id\":1}}", "Operation is true")]
    [InlineData("{\"Operation\":0}", "Item is missing")]
    [InlineData("{\"Operation\":0,\"Item\":{\"Id\":1}}", "no key field \"id\" (it has Id)")]
    [InlineData("{\"Operation\":0,\"Item\":{\"id\":1,\"version\":\"1.5\"}}", "not an integer")]
    public void A_message_that_can_never_be_applied_throws_naming_the_problem(string message, string words)
    {
        var e = Assert.Throws<ChangeException>(() => Apply(message));
        Assert.Contains(words, e.Message);
        Assert.Empty(_store.Rows());
    }
}
