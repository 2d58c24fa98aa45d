"""``python -m e2e.testbed``: build, start, stop and inspect the local Kubernetes test bed.

python -m e2e.testbed build          build missing binaries (e2e/testbed/build.sh)
python -m e2e.testbed up             build if needed, start, wait until ready
python -m e2e.testbed status [--json]
python -m e2e.testbed env            print `export KUBECONFIG=... PATH=...` for a shell
python -m e2e.testbed down [--purge] stop (and with --purge delete all state)

E2E_NODE=real runs pods on a real node (containerd, runc, the kubelet; e2e/testbed/realnode.py)
instead of the stand-in runner.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from e2e.testbed import controlplane
from e2e.testbed.settings import Settings, build


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.testbed", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build the binaries (idempotent)")
    p_up = sub.add_parser("up", help="start the test bed (idempotent)")
    p_up.add_argument("--no-build", action="store_true", help="fail instead of building")
    p_down = sub.add_parser("down", help="stop the test bed (idempotent)")
    p_down.add_argument("--purge", action="store_true", help="also delete etcd data, PVs, logs")
    p_status = sub.add_parser("status", help="show daemons, health and memory")
    p_status.add_argument("--json", action="store_true")
    sub.add_parser("env", help="print shell exports for kubectl and helm")
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    try:
        if args.cmd == "build":
            print(build(settings))
        elif args.cmd == "up":
            if not args.no_build:
                build(settings)
            controlplane.up(settings, log=_say)
            print(settings.admin_kubeconfig)
        elif args.cmd == "down":
            controlplane.down(settings, purge=args.purge, log=_say)
        elif args.cmd == "status":
            st = controlplane.status(settings)
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                print(f"up: {st['up']}   kubeconfig: {st['kubeconfig']}")
                for name, d in st["daemons"].items():
                    extra = f"  pods {d['pods_rss_mib']} MiB" if "pods_rss_mib" in d else ""
                    print(
                        f"  {name:<24} pid {d['pid'] or '-':<8} "
                        f"{'healthy' if d['healthy'] else 'DOWN':<8} {d['rss_mib']:>7} MiB{extra}"
                    )
                print(f"  total (control plane + runner): {st['total_rss_mib']} MiB")
            return 0 if st["up"] else 3
        elif args.cmd == "env":
            print(f"export KUBECONFIG={settings.admin_kubeconfig}")
            print(f'export PATH="{settings.bin_dir}:$PATH"')
    except controlplane.TestbedError as exc:
        _say(f"e2e.testbed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
