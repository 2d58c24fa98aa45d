"""hatchling's build hook: compiles headrace's one C extension into the wheel.

``headrace.records._kafka_check`` (``broker/headrace/records/_kafka_check.c``) checks
the structure of a Kafka producer's record section on the broker's produce path,
where per-record Python is not allowed (docs/decisions.md says why C). It is a
single C file with no dependency but Python's headers, so it is compiled here
with the C compiler Python was built with (``$CC`` overrides it), not through
setuptools. An editable install (``make setup``) builds it next to its source,
where the editable path finds it; a wheel gets it under ``headrace/records/``.
Without a compiler or Python's headers the build fails and says what to install.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("broker/headrace/records/_kafka_check.c")
PACKAGE_DIR = "headrace/records"


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        name = "_kafka_check" + str(sysconfig.get_config_var("EXT_SUFFIX"))
        if version == "editable":
            target = root / SOURCE.with_name(name)
        else:
            target = Path(tempfile.mkdtemp(prefix="headrace-ext-")) / name
            build_data["force_include"][str(target)] = f"{PACKAGE_DIR}/{name}"
        compile_extension(root / SOURCE, target)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True


def compile_extension(source: Path, target: Path) -> None:
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise RuntimeError(
            f"headrace's C extension needs Python's headers ({include}/Python.h is missing):"
            " install them, e.g. apt-get install python3-dev"
        )
    command = [
        *compiler,
        "-O2",
        "-shared",
        "-fPIC",
        "-Wall",
        "-Wextra",
        f"-I{include}",
        str(source),
        "-o",
        str(target),
    ]
    try:
        subprocess.run(command, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"cannot compile headrace's C extension ({shlex.join(command)}): {exc};"
            " it needs a C compiler, e.g. apt-get install gcc python3-dev"
        ) from exc
