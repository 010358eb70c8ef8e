"""JSON for the reference fixtures: lists of scalars kept on one line (small diffs), torch-free."""

import math


def _is_scalar_list(v):
    return isinstance(v, list) and all(isinstance(x, (int, float, str)) and not isinstance(x, bool) for x in v)


def dump_json(obj, indent=0):
    """json with lists of scalars kept on one line: small diffs, files well under 200 KB."""
    import json

    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {dump_json(v, indent + 1)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and not _is_scalar_list(obj):
        items = [pad + " " + dump_json(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError("non-finite float in reference")
    return json.dumps(obj, ensure_ascii=False)
