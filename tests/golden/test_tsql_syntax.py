"""Syntax tier: every reviewed SQL Server statement (tests/golden/mssql, tests/golden/mssql_sink, and the session
batch in tests/golden/mssql_session) parsed by a real T-SQL parser, sqlglot's `tsql` dialect (pinned in
scripts/test, installed into <target>/checks-venv).

What it proves: each statement is well-formed T-SQL as far as sqlglot knows the language (balanced parentheses,
clauses in order, CASE/CONVERT/OPENJSON/MERGE shapes, quoting of [bracketed]] names, no truncated text). It does
not prove that SQL Server accepts a statement (sqlglot is not SQL Server's parser, and it is lenient in places: a
CAST missing its closing parenthesis passed in a trial), nor what a statement means.

What sqlglot cannot parse is named below, each with why, and handled so that nothing else is let through:
- SUBSTITUTED before parsing: text sqlglot has no grammar for, replaced by the nearest form it has;
- UNPARSED: statements sqlglot keeps as an opaque command (exp.Command); only these prefixes may be opaque, and any
  other command fails the test. docs/sql-server.md lists the same.
Run: python -m unittest discover -s tests/golden -p 'test_*.py' (scripts/test does, before the Rust suite).
"""

import logging
import pathlib
import unittest

import sqlglot
from sqlglot import exp

ROOT = pathlib.Path(__file__).resolve().parent
FOLDERS = ("mssql", "mssql_sink", "mssql_session")

SUBSTITUTED = {
    # sqlglot 30's tsql dialect has no SET TRANSACTION ISOLATION LEVEL statement (it errors on ISOLATION).
    "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; ": "",
    # CHANGETABLE(CHANGES t, @v) is a rowset function whose CHANGES keyword sqlglot does not know; as a plain
    # function call the rest of the statement (joins, keyset, ORDER BY) is still parsed.
    "CHANGETABLE(CHANGES ": "CHANGETABLE(",
    # CHANGETABLE(VERSION t, (k1, k2), (T.k1, T.k2)), the backfill's row-version lookup: the same rowset function
    # with the VERSION keyword, parsed as a call over the table and the two lists.
    "CHANGETABLE(VERSION ": "CHANGETABLE(",
}

UNPARSED = (
    # IF ... BEGIN ... END around ROLLBACK: sqlglot parses the batch up to the END of the TRY-like block and
    # keeps the rest as a command.
    "END IF ",
    # SET IDENTITY_INSERT is a session option sqlglot does not model.
    "SET IDENTITY_INSERT ",
)


def statement(path):
    """The golden file's statement: every line but the comment naming its parameters."""
    lines = path.read_text(encoding="utf-8").splitlines()
    text = "\n".join(line for line in lines if not line.startswith("--"))
    for old, new in SUBSTITUTED.items():
        text = text.replace(old, new)
    return text


def problems(text):
    """Why sqlglot does not accept `text`: a parse error, or an opaque command not in UNPARSED."""
    try:
        parsed = [s for s in sqlglot.parse(text, read="tsql", error_level=sqlglot.ErrorLevel.RAISE) if s is not None]
    except sqlglot.errors.SqlglotError as e:
        return [str(e).splitlines()[0]]
    if not parsed:
        return ["no statement"]
    opaque = [c.sql("tsql") for s in parsed for c in s.find_all(exp.Command)]
    return [f"not parsed: {c[:120]}" for c in opaque if not c.startswith(UNPARSED)]


class GoldenStatementsParse(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        logging.getLogger("sqlglot").setLevel(logging.ERROR)

    def test_every_golden_statement_parses_as_tsql(self):
        files = sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.sql"))
        self.assertGreater(len(files), 40, "the golden folders are where this test expects them")
        failures = {p.relative_to(ROOT).as_posix(): problems(statement(p)) for p in files}
        failures = {name: why for name, why in failures.items() if why}
        self.assertEqual(failures, {}, "golden statements that are not well-formed T-SQL")

    def test_the_parser_rejects_what_sql_server_rejects(self):
        # The tier is worth something only if a broken statement fails it.
        good = statement(ROOT / "mssql" / "ct_fetch_after_key.sql")
        self.assertEqual(problems(good), [])
        self.assertNotEqual(problems(good.rstrip(")").rsplit(")", 1)[0]), [], "an unbalanced parenthesis")
        self.assertNotEqual(problems(good.replace(" ORDER BY ", " ORDER ", 1)), [], "a clause cut short")
        self.assertNotEqual(problems(good.replace(" END AS INT)", " AS INT)", 1)), [], "a CASE without END")
        self.assertNotEqual(problems(good.replace(" WHERE ", " WHERE AND ", 1)), [], "a predicate missing")
        self.assertNotEqual(problems(good.replace(" FROM ", " FORM ", 1)), [], "a misspelled keyword")
        self.assertNotEqual(problems("SELECT [a]] FROM t"), [], "an unterminated bracketed name")


if __name__ == "__main__":
    unittest.main()
