"""The Kubernetes manifests (deploy/kubernetes/): tierd's config in the ConfigMap is one the real
tierd accepts, the admin token lies outside every host directory training pods mount, and the
example training pod runs as a non-root uid (issue 30, finding 13: pods ran as uid 0 with
/run/tierd mounted, so each one shared one namespace and could read the admin token)."""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

import yaml

ARGS = None


def documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def under(path, directory):
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        docs = documents(os.path.join(ARGS.manifests, "daemonset.yaml"))
        cls.config_text = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["tierd.conf"]
        cls.daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
        cls.trainer = next(d for d in documents(
            os.path.join(ARGS.manifests, "trainer-pod-example.yaml")) if d["kind"] == "Pod")
        # What tierd makes of the ConfigMap's file (--print-config: every key, defaults filled).
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
            f.write(cls.config_text)
        try:
            run = subprocess.run([ARGS.tierd, "--config=" + f.name, "--print-config"],
                                 capture_output=True, text=True, timeout=30)
        finally:
            os.unlink(f.name)
        cls.print_rc, cls.print_err = run.returncode, run.stderr
        cls.config = {}
        for line in run.stdout.splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                cls.config[key.strip()] = value.strip()

    def test_tierd_accepts_the_config(self):
        self.assertEqual(self.print_rc, 0, self.print_err)

    def tierd_container(self):
        return self.daemonset["spec"]["template"]["spec"]["containers"][0]

    def host_paths_of(self, pod_spec, container):
        """{mountPath in the container: host path} for its hostPath volumes."""
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        out = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                out[mount["mountPath"]] = volume["hostPath"]["path"]
        return out

    def test_the_admin_token_is_outside_what_trainers_mount(self):
        spec = self.daemonset["spec"]["template"]["spec"]
        tierd_mounts = self.host_paths_of(spec, self.tierd_container())
        trainer_spec = self.trainer["spec"]
        trainer_hosts = set()
        for container in trainer_spec["containers"]:
            trainer_hosts.update(self.host_paths_of(trainer_spec, container).values())
        token = self.config.get("admin_token_file") or self.config["socket"] + ".admin-token"
        # Where the token lands on the host, if in a hostPath at all.
        for mount_path, host_path in tierd_mounts.items():
            if under(token, mount_path):
                on_host = os.path.join(host_path, os.path.relpath(token, mount_path))
                for shared in trainer_hosts:
                    self.assertFalse(under(on_host, shared),
                                     "the admin token %s (%s on the host) is in %s, which "
                                     "training pods mount" % (token, on_host, shared))
        # The sockets are (that is how trainers reach tierd).
        self.assertTrue(any(under(self.config["socket"], m) and h in trainer_hosts
                            for m, h in tierd_mounts.items()))
        # tierctl in tierd's pod finds the token.
        env = {e["name"]: e.get("value") for e in self.tierd_container().get("env", [])}
        if self.config.get("admin_token_file"):
            self.assertEqual(env.get("TIER_ADMIN_TOKEN"), self.config["admin_token_file"])

    def test_the_example_trainer_runs_as_a_non_root_uid(self):
        spec = self.trainer["spec"]
        pod = spec.get("securityContext", {})
        for container in spec["containers"]:
            ctx = dict(pod, **container.get("securityContext", {}))
            self.assertTrue(ctx.get("runAsNonRoot"), container["name"])
            self.assertNotEqual(ctx.get("runAsUser", 0), 0, container["name"])
            self.assertFalse(ctx.get("privileged", False))
        self.assertTrue(spec.get("hostIPC"))

    def test_the_sockets_admit_the_trainers_uid(self):
        # A non-root trainer uid must be able to connect: world access, or a group it is given.
        mode = int(self.config["socket_mode"], 8)
        groups = self.trainer["spec"].get("securityContext", {}).get("supplementalGroups", [])
        self.assertTrue(mode & 0o006 == 0o006 or (mode & 0o060 and groups),
                        "socket_mode %o shuts a non-root trainer out" % mode)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifests", required=True)
    parser.add_argument("--tierd", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
