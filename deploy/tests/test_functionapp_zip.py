"""scripts/lib/functionapp_zip.py: the zip holds exactly host.json, handler (mode 0755) and the function
folders' files, and refuses inputs that would make a broken app."""

import os
import sys
import tempfile
import unittest
import zipfile

from support import path

sys.path.insert(0, path("scripts", "lib"))
import functionapp_zip as fz  # noqa: E402


class FunctionAppZip(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.handler = self.file("build/handler", b"\x7fELF...", 0o644)  # the mode on disk must not matter

    def file(self, rel, data=b"{}", mode=0o644):
        p = os.path.join(self.dir.name, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)
        return p

    def function(self, name, *extra):
        self.file(f"{name}/function.json")
        self.file(f"{name}/sqltrigger.json")
        for rel in extra:
            self.file(f"{name}/{rel}")
        return os.path.join(self.dir.name, name)

    def build(self, *functions):
        out = os.path.join(self.dir.name, "app.zip")
        entries = fz.plan(path("host.json"), self.handler, list(functions))
        fz.write(out, entries)
        return fz.verify(out, entries), out

    def test_the_handler_is_executable_and_nothing_else_is(self):
        infos, out = self.build(self.function("Orders"))
        modes = {i.filename: i.external_attr >> 16 for i in infos}
        self.assertEqual(modes, {"host.json": 0o100644, "handler": 0o100755,
                                 "Orders/function.json": 0o100644, "Orders/sqltrigger.json": 0o100644})
        with zipfile.ZipFile(out) as z:
            self.assertEqual(z.read("handler"), b"\x7fELF...")

    def test_secrets_and_local_state_in_a_function_folder_are_left_out(self):
        folder = self.function("Orders", "local.settings.json", ".sql-pseudo-trigger/Orders.json", ".env")
        infos, _ = self.build(folder)
        self.assertEqual(sorted(i.filename for i in infos),
                         ["Orders/function.json", "Orders/sqltrigger.json", "handler", "host.json"])

    def test_the_same_inputs_give_the_same_zip(self):
        folder = self.function("Orders")
        _, out = self.build(folder)
        with open(out, "rb") as f:
            first = f.read()
        _, out = self.build(folder)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), first)

    def test_a_folder_without_function_json_is_refused(self):
        self.file("NotAFunction/sqltrigger.json")
        with self.assertRaisesRegex(fz.PackageError, "has no function.json"):
            self.build(os.path.join(self.dir.name, "NotAFunction"))

    def test_two_folders_of_one_name_are_refused(self):
        a = self.function("Orders")
        self.file("other/Orders/function.json")
        with self.assertRaisesRegex(fz.PackageError, "two function folders are named 'Orders'"):
            self.build(a, os.path.join(self.dir.name, "other", "Orders"))

    def test_no_function_is_refused(self):
        with self.assertRaisesRegex(fz.PackageError, "no function folder given"):
            self.build()


if __name__ == "__main__":
    unittest.main()
