#!/usr/bin/env python3
"""The project's shape, checked (docs/design.md, "Layout"): layers import one way, product code
reaches the CUDA emulator through one hook, and no product source file grows past 600 lines.

    check_shape.py [ROOT]      exit 1 and one line per violation, else a summary line

The layers, lowest first: kernels, cache, model, server (config is a leaf beside them, read by the
server). A file may include its own folder's headers and those of any lower layer, never a higher
one's. The emulator lives in tests/cuda_emu; product files reach it only through
kernels/cuda/emulator_hook.hpp."""
import re
import sys
from pathlib import Path

LAYERS = {"kernels": 0, "cache": 1, "model": 2, "server": 3}
# config/ is a leaf: it may include kernels' plain headers (the KV dtype enum), and only server/
# includes config/.
ALLOWED_EXTRA = {"config": {"kernels"}, "server": {"config"}}
PRODUCT = ("kernels", "cache", "model", "server", "config")
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".inc")
MAX_LINES = 600
EMU_HOOK = "kernels/cuda/emulator_hook.hpp"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    problems = []
    files = 0
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            files += 1
            rel = path.relative_to(root).as_posix()
            lines = path.read_text(errors="replace").splitlines()
            if len(lines) > MAX_LINES and path.suffix in (".cpp", ".cu", ".hpp", ".cuh"):
                problems.append(f"{rel}: {len(lines)} lines (at most {MAX_LINES}: split it by concept)")
            for number, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                head = target.split("/", 1)[0]
                if "cuda_emu" in target or "cuda/emu/" in target or target.startswith("tests/"):
                    if rel != EMU_HOOK:
                        problems.append(f"{rel}:{number}: includes the emulator ({target}) outside {EMU_HOOK}")
                    continue
                if head not in LAYERS and head != "config":
                    continue  # a system or third-party header
                if head == top:
                    continue
                if head in ALLOWED_EXTRA.get(top, set()):
                    continue
                if top == "config" or head == "config" or LAYERS[head] > LAYERS[top]:
                    problems.append(f"{rel}:{number}: {top}/ includes {target} (a higher or sideways layer)")
    for p in problems:
        print(p)
    print(f"check_shape: {files} product files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
