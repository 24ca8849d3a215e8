"""The idempotency contract of changes.py, message by message as the queue would deliver them, against both
stores (in memory and SQLite): python3 -m unittest discover samples/consumer-python"""

import json
import os
import tempfile
import unittest

from changes import ChangeError, MemoryStore, Options, apply_change, options_from_env
from sqlite_store import SqliteStore


def insert(id, version=None, **extra):
    item = {"id": id, "customer": "ada", "amount": 12.5, **extra}
    if version is not None:
        item["version"] = version
    return {"Operation": 0, "Item": item}


def update(id, version=None, **extra):
    change = insert(id, version, **extra)
    change["Operation"] = 1
    change["Item"]["amount"] = 20.0
    return change


def delete(id, **key):
    return {"Operation": 2, "Item": {"id": id, **key}}


def as_host_writes_it(change):
    """Each change's Newtonsoft ToString() on the queue: indented, CRLF line ends."""
    return json.dumps(change, indent=2).replace("\n", "\r\n")


class Contract:
    """The cases every store must pass; subclasses say which store."""

    def new_store(self):
        raise NotImplementedError

    def setUp(self):
        self.store = self.new_store()

    def apply(self, message, options=Options()):
        return apply_change(self.store, message, options).outcome

    def test_a_change_delivered_twice_is_applied_once(self):
        self.assertEqual(self.apply(insert(1, "100")), "applied")
        self.assertEqual(self.apply(insert(1, "100")), "duplicate")
        self.assertEqual(self.store.rows(), [insert(1, "100")["Item"]])

    def test_an_older_version_arriving_after_a_newer_one_is_ignored(self):
        self.apply(insert(1, "100"))
        self.apply(update(1, "105"))
        self.assertEqual(self.apply(insert(1, "100")), "stale")
        self.assertEqual(self.store.rows(), [update(1, "105")["Item"]])

    def test_versions_are_compared_as_integers_not_as_text(self):
        self.apply(update(1, "10"))
        self.assertEqual(self.apply(update(1, "9")), "stale")
        self.assertEqual(self.apply(update(1, "18446744073709551615")), "applied")
        self.assertEqual(self.apply(update(1, 11)), "stale")

    def test_an_insert_delivered_again_after_its_delete_leaves_the_row_deleted(self):
        self.apply(insert(1, "100"))
        self.assertEqual(self.apply(delete(1)), "deleted")
        self.assertEqual(self.apply(insert(1, "100")), "stale")
        self.assertEqual(self.store.rows(), [])

    def test_a_repeated_delete_is_a_duplicate_and_a_newer_insert_brings_the_key_back(self):
        self.apply(insert(1, "100"))
        self.apply(delete(1))
        self.assertEqual(self.apply(delete(1)), "duplicate")
        self.assertEqual(self.apply(insert(1, "200")), "applied")
        self.assertEqual(self.store.rows(), [insert(1, "200")["Item"]])

    def test_a_message_as_the_host_writes_it_parses(self):
        text = as_host_writes_it(insert(7, "300"))
        self.assertIn('\r\n  "Operation": 0', text)
        self.assertEqual(self.apply(text), "applied")
        self.assertEqual(self.apply(text.encode("utf-8")), "duplicate")
        self.assertEqual(self.apply(as_host_writes_it(delete(7))), "deleted")

    def test_without_a_version_the_last_change_wins_and_an_exact_repeat_is_a_duplicate(self):
        options = Options(version_field="")
        self.apply(insert(1), options)
        self.assertEqual(self.apply(update(1), options), "applied")
        reordered = {"Item": {"amount": 20.0, "customer": "ada", "id": 1}, "Operation": 1}
        self.assertEqual(self.apply(reordered, options), "duplicate")
        self.assertEqual(self.store.rows(), [{"id": 1, "customer": "ada", "amount": 20.0}])

    def test_without_versions_an_insert_delivered_again_after_its_delete_comes_back_the_documented_limit(self):
        options = Options(version_field=None)
        self.apply(insert(1, "100"), options)
        self.apply(delete(1), options)
        self.assertEqual(self.apply(insert(1, "100"), options), "applied")
        self.assertEqual(len(self.store.rows()), 1)

    def test_composite_keys_identify_a_row_by_all_their_fields(self):
        options = Options(key_fields=("tenant", "id"))
        self.apply(insert(1, "1", tenant="a"), options)
        self.apply(insert(1, "1", tenant="b"), options)
        self.apply(delete(1, tenant="a"), options)
        self.assertEqual([r["tenant"] for r in self.store.rows()], ["b"])

    def test_a_message_that_can_never_be_applied_raises_a_change_error_naming_the_problem(self):
        cases = [
            ("not json", "not JSON"),
            ("[1, 2]", "not a JSON object"),
            ({"Operation": 3, "Item": {"id": 1}}, "Operation is 3"),
            ({"Operation": True, "Item": {"id": 1}}, "Operation is true"),
            ({"Operation": 0}, "Item is missing"),
            ({"Operation": 0, "Item": {"Id": 1}}, 'no key field "id" (it has Id)'),
            (insert(1, "1.5"), "not an integer"),
        ]
        for message, words in cases:
            with self.subTest(message=message):
                with self.assertRaises(ChangeError) as caught:
                    self.apply(message)
                self.assertIn(words, str(caught.exception))
        self.assertEqual(self.store.rows(), [])


class MemoryStoreContract(Contract, unittest.TestCase):
    def new_store(self):
        return MemoryStore()


class SqliteStoreContract(Contract, unittest.TestCase):
    def new_store(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        store = SqliteStore(os.path.join(self.dir.name, "orders.sqlite3"))
        self.addCleanup(store.close)
        return store

    def test_rows_survive_a_restart(self):
        path = os.path.join(self.dir.name, "orders.sqlite3")
        self.apply(insert(1, "100"))
        self.apply(delete(1))
        self.store.close()
        self.store = SqliteStore(path)
        self.addCleanup(self.store.close)
        self.assertEqual(self.apply(insert(1, "100")), "stale")


class OptionsFromEnv(unittest.TestCase):
    def test_options_come_from_orders_key_fields_and_orders_version_field(self):
        self.assertEqual(options_from_env({}), Options(("id",), "version"))
        self.assertEqual(
            options_from_env({"ORDERS_KEY_FIELDS": "tenant, id", "ORDERS_VERSION_FIELD": ""}),
            Options(("tenant", "id"), ""),
        )


if __name__ == "__main__":
    unittest.main()
