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


def function_partitions():
    """The partitions of each example function (`"partitions"` in its sqltrigger.json; 1 when absent)."""
    found = {}
    for f in glob.glob(path("deploy", "container", "functions", "*", "sqltrigger.json")):
        with open(f, encoding="utf-8") as fh:
            found[os.path.basename(os.path.dirname(f))] = json.load(fh).get("partitions", 1)
    return found


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
                    self.assertNotIn(doc["kind"], self.docs, f"two {doc['kind']} documents")
                    self.docs[doc["kind"]] = doc
        self.pod = self.docs["Deployment"]["spec"]["template"]["spec"]
        (self.container,) = self.pod["containers"]
        self.env = {e["name"]: e.get("value") for e in self.container.get("env", [])}

    def test_the_secret_holds_every_connection_string_and_the_pod_reads_it(self):
        secret = self.docs["Secret"]
        self.assertEqual(set(secret["stringData"]),
                         function_settings() | {"AzureWebJobsStorage", "Sql_Trigger_AdminKey"})
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

    def test_the_admin_port_is_reachable_from_other_pods_only_with_the_key(self):
        args = self.container["args"]
        port = args[args.index("--admin-port") + 1]
        self.assertEqual(args[args.index("--admin-bind") + 1], "0.0.0.0")
        self.assertEqual([(p["name"], str(p["containerPort"])) for p in self.container["ports"]], [("admin", port)])
        # The key reaches the process from the Secret the pod reads
        self.assertIn("Sql_Trigger_AdminKey", self.docs["Secret"]["stringData"])
        service = self.docs["Service"]
        self.assertEqual(service["spec"]["selector"], self.docs["Deployment"]["spec"]["selector"]["matchLabels"])
        (service_port,) = service["spec"]["ports"]
        self.assertEqual((str(service_port["port"]), service_port["targetPort"]), (port, "admin"))

    def test_keda_reads_the_scale_route_through_the_service_with_the_key_from_the_secret(self):
        scaled = self.docs["ScaledObject"]
        self.assertEqual(scaled["apiVersion"], "keda.sh/v1alpha1")
        self.assertEqual(scaled["spec"]["scaleTargetRef"]["name"], self.docs["Deployment"]["metadata"]["name"])
        (trigger,) = scaled["spec"]["triggers"]
        self.assertEqual(trigger["type"], "metrics-api")
        meta = trigger["metadata"]
        # The keys the metrics-api scaler requires, each a string as KEDA's metadata must be
        for key in ("url", "valueLocation", "targetValue"):
            self.assertIsInstance(meta[key], str, key)
        service = self.docs["Service"]
        (service_port,) = service["spec"]["ports"]
        url = re.fullmatch(r"http://([a-z0-9-]+)\.[a-z0-9-]+\.svc\.cluster\.local:(\d+)(/\S*)", meta["url"])
        self.assertIsNotNone(url, meta["url"])
        self.assertEqual(url.groups(), (service["metadata"]["name"], str(service_port["port"]), "/admin/scale"))
        # target_replicas is the replica count itself: one per unit of the target
        self.assertEqual((meta["valueLocation"], float(meta["targetValue"])), ("target_replicas", 1.0))
        # apiKey mode, in the header the handler reads, with the key from the Secret the pod reads
        self.assertEqual((meta["authMode"], meta.get("method", "header")), ("apiKey", "header"))
        self.assertEqual(meta.get("keyParamName", "X-API-KEY").lower(), "x-api-key")
        auth = self.docs["TriggerAuthentication"]
        self.assertEqual(trigger["authenticationRef"]["name"], auth["metadata"]["name"])
        (ref,) = auth["spec"]["secretTargetRef"]
        self.assertEqual((ref["parameter"], ref["name"], ref["key"]),
                         ("apiKey", self.docs["Secret"]["metadata"]["name"], "Sql_Trigger_AdminKey"))

    def test_replicas_stay_between_one_and_the_partitions(self):
        spec = self.docs["ScaledObject"]["spec"]
        # At least one: the replicas answer the scale route themselves; at most the fewest partitions of any
        # function, beyond which a replica would own no partition.
        self.assertEqual(spec["minReplicaCount"], 1)
        self.assertGreater(spec["maxReplicaCount"], 1)
        self.assertLessEqual(spec["maxReplicaCount"], min(function_partitions().values()))


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
