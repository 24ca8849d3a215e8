"""deploy/flex/main.bicep, checked offline: it parses as Bicep (pycep-parser), it makes a Flex Consumption app
whose runtime is `custom` and whose storage is identity-based, it sets none of the settings Flex rejects, and
its defaults match the function template the zip ships. Not checked here (no Bicep CLI, no Azure): that ARM
accepts it, and what-if or a real deployment."""

import re
import unittest

from support import INSTALL_HINT, path, read, read_json, without_line_comments

try:
    from pycep import BicepParser
except ImportError:  # pragma: no cover - scripts/test installs it
    BicepParser = None

TEMPLATE = ("deploy", "flex", "main.bicep")
# Flex Consumption refuses these app settings: the plan sets the runtime and the deployment itself.
REJECTED_ON_FLEX = [
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "SCM_DO_BUILD_DURING_DEPLOYMENT",
]
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"


@unittest.skipIf(BicepParser is None, f"pycep-parser is not installed; {INSTALL_HINT}")
class FlexTemplate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bicep = BicepParser().parse(file_path=__import__("pathlib").Path(path(*TEMPLATE)))
        cls.resources = cls.bicep["resources"]
        cls.params = cls.bicep["parameters"]

    def of_type(self, type_):
        found = [r for r in self.resources.values() if r["type"] == type_]
        self.assertTrue(found, f"no {type_} resource")
        return found

    def setting_names(self):
        base = self.bicep["variables"]["baseSettings"]["value"]
        return [s["name"] for s in base], {s["name"]: s["value"] for s in base}

    def test_every_resource_names_its_api_version(self):
        for name, r in self.resources.items():
            self.assertRegex(r["api_version"], r"^\d{4}-\d{2}-\d{2}(-preview)?$", name)

    def test_the_plan_is_flex_consumption_on_linux(self):
        (plan,) = self.of_type("Microsoft.Web/serverfarms")
        self.assertEqual(plan["config"]["sku"], {"tier": "FlexConsumption", "name": "FC1"})
        self.assertIs(plan["config"]["properties"]["reserved"], True)

    def test_the_runtime_is_custom_in_function_app_config(self):
        (site,) = self.of_type("Microsoft.Web/sites")
        config = site["config"]["properties"]["functionAppConfig"]
        self.assertEqual(config["runtime"], {"name": "custom", "version": "1.0"})
        self.assertEqual(site["config"]["kind"], "functionapp,linux")
        storage = config["deployment"]["storage"]
        self.assertEqual(storage["type"], "blobContainer")
        self.assertEqual(storage["authentication"]["type"], "UserAssignedIdentity")

    def test_no_setting_flex_rejects_appears_anywhere_outside_comments(self):
        code = without_line_comments(read(*TEMPLATE))
        for name in REJECTED_ON_FLEX:
            self.assertNotIn(name, code)

    def test_storage_is_identity_based_with_the_user_assigned_identity(self):
        (site,) = self.of_type("Microsoft.Web/sites")
        self.assertEqual(site["config"]["identity"]["type"], "UserAssigned")
        names, values = self.setting_names()
        self.assertIn("AzureWebJobsStorage__accountName", names)
        self.assertEqual(values["AzureWebJobsStorage__credential"], "managedidentity")
        self.assertIn("AzureWebJobsStorage__clientId", names)
        self.assertNotIn("AzureWebJobsStorage", names)
        (account,) = self.of_type("Microsoft.Storage/storageAccounts")
        self.assertIs(account["config"]["properties"]["allowSharedKeyAccess"], False)

    def test_the_identity_may_use_blobs_and_queues(self):
        code = read(*TEMPLATE)
        granted = [r for r in self.resources.values() if r["type"] == "Microsoft.Authorization/roleAssignments"]
        self.assertGreaterEqual(len(granted), 2)
        for role in (BLOB_DATA_OWNER, QUEUE_DATA_CONTRIBUTOR):
            self.assertIn(role, code)
        for r in granted:
            self.assertEqual(r["config"]["properties"]["principalType"], "ServicePrincipal")

    def test_the_queue_exists_and_matches_the_function_template(self):
        (queue,) = self.of_type("Microsoft.Storage/storageAccounts/queueServices/queues")
        self.assertEqual(queue["config"]["name"], "queueName")
        function = self.params["functionName"]["default"]
        bindings = read_json("function-templates", function, "function.json")["bindings"]
        queues = [b["queueName"] for b in bindings if b["type"] == "queue"]
        self.assertEqual(queues, [self.params["queueName"]["default"]])

    def test_the_default_function_gets_the_settings_its_files_name(self):
        function = self.params["functionName"]["default"]
        bindings = read_json("function-templates", function, "function.json")["bindings"]
        (timer,) = [b for b in bindings if b["type"] == "timerTrigger"]
        self.assertEqual(timer["schedule"], "%" + function + "_Schedule%")
        names, _ = self.setting_names()
        self.assertIn("${functionName}_Schedule", names)
        trigger = read_json("function-templates", function, "sqltrigger.json")
        self.assertEqual(self.params["connectionStringSetting"]["default"], trigger["connectionStringSetting"])

    def test_the_default_schedule_is_the_templates(self):
        # The schedule the templates ship (local.settings.json.example) is the pace docs/operations.md states
        # and tests/templates.rs checks; the deployed default must not fall behind it.
        function = self.params["functionName"]["default"]
        example = read_json("local.settings.json.example")["Values"]
        self.assertEqual(self.params["schedule"]["default"], example[function + "_Schedule"])

    def test_the_connection_string_is_a_secure_parameter(self):
        decorators = [d["type"] for d in self.params["connectionString"]["decorators"]]
        self.assertIn("secure", decorators)

    def test_deploy_sh_ships_the_function_the_template_configures(self):
        script = read("deploy", "flex", "deploy.sh")
        shipped = re.search(r'FUNCTIONS:-([^}]*)\}', script).group(1).split()
        self.assertIn(self.params["functionName"]["default"], shipped)
        self.assertNotIn("OrdersChanged", shipped)  # it would need settings the template does not set


if __name__ == "__main__":
    unittest.main()
