"""Helpers for the tests, one module per concern; tests import them as ``support.<module>``
(conftest.py puts tests/ on sys.path and defines the fixtures).

- ``commands``: the commands under test (the installed console scripts, the binary)
- ``guard``: the stand-in python3 on PATH that fails a test starting an interpreter by name
- ``harness``: running ponytail, a stand-in container (``Sleeper``), OCI bundles and states,
  what a run left behind (mounts, tree digests)
- ``fakehost``: fake NVIDIA hosts and small rootfs images
- ``engines``: real container engines (runc, crun, podman, dockerd) with private state
- ``hostile``: the stage for hostile-image tests
- ``cdi_support``: CDI specs and podman reading them
- ``containerd_cri``: a private containerd and a small CRI client
- ``hostdata``: host data for the pure core's unit tests (tests/unit/), built as the
  probe's plain records: no root, no files
"""
