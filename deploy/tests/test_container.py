"""The container for `handler run` and its Kubernetes and Container Apps examples, checked offline: the YAML
parses, the image runs `handler run` as a non-root user, every setting the example function names reaches the
process, and SIGTERM has time to finish a tick. Not checked here (no Docker engine, no cluster): building the
image, and kubectl or az accepting the manifests."""

import glob
import json
import os
import re
import unittest

from support import INSTALL_HINT, path, read

try:
    import yaml
except ImportError:  # pragma: no cover - scripts/test installs it
    yaml = None


def function_settings():
    """Every app setting the example function folders name (source and sink connection strings)."""
    names = set()
    for f in glob.glob(path("deploy", "container", "functions", "*", "sqltrigger.json")):
        with open(f, encoding="utf-8") as fh:
            trigger = json.load(fh)
        names.add(trigger["connectionStringSetting"])
        if "connectionStringSetting" in trigger.get("sink", {}):
            names.add(trigger["sink"]["connectionStringSetting"])
    return names


class Dockerfile(unittest.TestCase):
    def setUp(self):
        self.text = read("deploy", "container", "Dockerfile")

    def test_it_runs_handler_run_on_the_copied_functions(self):
        self.assertIn('ENTRYPOINT ["/app/handler", "run", "--app-root", "/app/functions"]', self.text)
        self.assertRegex(self.text, r"COPY --chmod=0755 dist/handler /app/handler")
        self.assertIn("COPY deploy/container/functions/ /app/functions/", self.text)

    def test_it_runs_as_a_non_root_user_with_the_system_roots(self):
        users = re.findall(r"^USER (\S+)", self.text, re.M)
        self.assertEqual(len(users), 1)
        self.assertNotIn(users[0], ("root", "0"))
        self.assertIn("ca-certificates", self.text)

    def test_the_build_context_lets_in_only_what_it_copies(self):
        ignore = read("deploy", "container", "Dockerfile.dockerignore").split()
        self.assertEqual([l for l in ignore if not l.startswith("#") and l in ("*", "!dist/handler",
                         "!deploy/container/functions/")], ["*", "!dist/handler", "!deploy/container/functions/"])

    def test_the_example_function_delivers_to_a_sink_on_a_timer(self):
        folders = glob.glob(path("deploy", "container", "functions", "*"))
        self.assertTrue(folders)
        for folder in folders:
            with open(os.path.join(folder, "function.json"), encoding="utf-8") as f:
                bindings = json.load(f)["bindings"]
            self.assertEqual([b["type"] for b in bindings], ["timerTrigger"], folder)
            with open(os.path.join(folder, "sqltrigger.json"), encoding="utf-8") as f:
                trigger = json.load(f)
            self.assertEqual(trigger["deliveryMode"], "sink", folder)
            self.assertIn("type", trigger["sink"], folder)


@unittest.skipIf(yaml is None, f"PyYAML is not installed; {INSTALL_HINT}")
class Kubernetes(unittest.TestCase):
    def setUp(self):
        self.docs = {}
        for f in sorted(glob.glob(path("deploy", "container", "kubernetes", "*.yaml"))):
            with open(f, encoding="utf-8") as fh:
                for doc in yaml.safe_load_all(fh):
                    self.assertIn("apiVersion", doc, f)
                    self.docs[doc["kind"]] = doc
        self.pod = self.docs["Deployment"]["spec"]["template"]["spec"]
        (self.container,) = self.pod["containers"]
        self.env = {e["name"]: e.get("value") for e in self.container.get("env", [])}

    def test_the_secret_holds_every_connection_string_and_the_pod_reads_it(self):
        secret = self.docs["Secret"]
        self.assertEqual(set(secret["stringData"]), function_settings() | {"AzureWebJobsStorage"})
        refs = [e["secretRef"]["name"] for e in self.container["envFrom"]]
        self.assertEqual(refs, [secret["metadata"]["name"]])

    def test_state_is_in_blob_under_a_fixed_app_name(self):
        self.assertEqual(self.env["Sql_Trigger_StateStore"], "blob")
        self.assertTrue(self.env["Sql_Trigger_AppName"])

    def test_sigterm_has_time_to_finish_a_tick(self):
        tick_s = int(self.env["Sql_Trigger_TickTimeoutMs"]) / 1000
        self.assertGreater(self.pod["terminationGracePeriodSeconds"], tick_s)

    def test_it_runs_as_non_root_without_privileges(self):
        self.assertIs(self.pod["securityContext"]["runAsNonRoot"], True)
        self.assertIs(self.container["securityContext"]["allowPrivilegeEscalation"], False)
        self.assertEqual(self.container["securityContext"]["capabilities"]["drop"], ["ALL"])

    def test_keda_is_a_marked_placeholder_not_a_scaled_object(self):
        self.assertNotIn("ScaledObject", self.docs)
        self.assertIn("KEDA (placeholder)", read("deploy", "container", "kubernetes", "deployment.yaml"))


@unittest.skipIf(yaml is None, f"PyYAML is not installed; {INSTALL_HINT}")
class ContainerApps(unittest.TestCase):
    def setUp(self):
        with open(path("deploy", "container", "containerapp.yaml"), encoding="utf-8") as f:
            self.app = yaml.safe_load(f)
        self.template = self.app["properties"]["template"]
        (self.container,) = self.template["containers"]
        self.env = {e["name"]: e for e in self.container["env"]}

    def test_every_connection_string_comes_from_a_secret(self):
        secrets = {s["name"] for s in self.app["properties"]["configuration"]["secrets"]}
        for name in function_settings():
            self.assertIn(secrets and self.env[name].get("secretRef"), secrets, name)

    def test_state_is_in_blob_through_the_user_assigned_identity(self):
        self.assertEqual(self.app["identity"]["type"], "UserAssigned")
        self.assertEqual(self.env["AzureWebJobsStorage__credential"]["value"], "managedidentity")
        self.assertIn("AzureWebJobsStorage__clientId", self.env)
        self.assertEqual(self.env["Sql_Trigger_StateStore"]["value"], "blob")

    def test_one_replica_always_on_and_time_to_finish_a_tick(self):
        self.assertEqual(self.template["scale"], {"minReplicas": 1, "maxReplicas": 1})
        tick_s = int(self.env["Sql_Trigger_TickTimeoutMs"]["value"]) / 1000
        self.assertGreater(self.template["terminationGracePeriodSeconds"], tick_s)
        self.assertNotIn("ingress", self.app["properties"]["configuration"])


if __name__ == "__main__":
    unittest.main()
