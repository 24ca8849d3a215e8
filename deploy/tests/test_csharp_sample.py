"""The C# consumer sample cannot be built or tested here (no .NET SDK can be installed on these machines), so
this checks what can be checked without one: every .cs file parses (tree-sitter's C# grammar) and every
project is well-formed XML targeting the same framework. Type errors and test failures are not caught."""

import glob
import unittest
import xml.etree.ElementTree as ET

from support import INSTALL_HINT, path

try:
    import tree_sitter
    import tree_sitter_c_sharp
except ImportError:  # pragma: no cover - scripts/test installs them
    tree_sitter = None

SAMPLE = ("samples", "consumer-csharp")


def problems(node, found):
    if node.is_error or node.is_missing:
        found.append(f"{node.type} at line {node.start_point[0] + 1}")
    for child in node.children:
        problems(child, found)
    return found


class CSharpSample(unittest.TestCase):
    def test_the_projects_are_well_formed_and_target_one_framework(self):
        projects = glob.glob(path(*SAMPLE, "*", "*.csproj"))
        self.assertEqual(len(projects), 2)
        frameworks = {ET.parse(p).getroot().findtext("PropertyGroup/TargetFramework") for p in projects}
        self.assertEqual(len(frameworks), 1, frameworks)

    @unittest.skipIf(tree_sitter is None, f"tree-sitter-c-sharp is not installed; {INSTALL_HINT}")
    def test_every_source_file_parses(self):
        parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_c_sharp.language()))
        files = glob.glob(path(*SAMPLE, "**", "*.cs"), recursive=True)
        self.assertGreaterEqual(len(files), 4)
        for f in files:
            with open(f, "rb") as fh:
                tree = parser.parse(fh.read())
            self.assertEqual(problems(tree.root_node, []), [], f)


if __name__ == "__main__":
    unittest.main()
