"""Helpers for the tests, one module per concern; tests import them as ``support.<module>``
(conftest.py puts tests/ on sys.path and defines the fixtures).

- ``commands``: the commands under test (the installed console scripts, the binary)
- ``guard``: the stand-in python3 on PATH that fails a test starting an interpreter by name
- ``harness``: running ponytail, a stand-in container (``Sleeper``), OCI bundles and states,
  what a run left behind (mounts, tree digests)
- ``fakehost``: fake NVIDIA hosts and small rootfs images
- ``engines``: real container engines (runc, crun, podman, dockerd) with private state
- ``sidroot``: Debian sid's current engines, each run in a cached sid root (make test-engines)
- ``hostile``: the stage for hostile-image tests
- ``cdi_support``: CDI specs and podman reading them
- ``containerd_cri``: a private containerd (Debian 12's or sid's) and a small CRI client
- ``cri_nodes``: a GPU node's containerd 2.1 with CDI spec directories of its own, and its CRI client
- ``crio``: CRI-O's configuration as CRI-O reads it (no CRI-O runs)
- ``hostdata``: host data for the pure core's unit tests (tests/unit/), built as the
  probe's plain records: no root, no files
"""
