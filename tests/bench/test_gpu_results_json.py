"""bench/results' JSON: the same data as json.dumps gives, indented only down to the depth it flattens at."""

from __future__ import annotations

import json
import math

from bench.gpu_common import Report, Timing, results_json


def test_results_json_keeps_the_data_and_flattens_deep_values(tmp_path) -> None:
    data = {"info": {"gpu": "H200", "mk_profile": {"d0": {"groups": [{"op": "FFN_UP", "step_us": 55.8}] * 3}}},
            "checks": [], "notes": ["a", "b"], "n": 3, "x": 0.1, "empty": {}}
    text = results_json(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    # the top levels one key a line; a value four levels down one line whatever its size
    assert ' "info": {' in lines and '  "gpu": "H200",' in lines and '   "d0": {' in lines
    assert '    "groups": [{"op":"FFN_UP","step_us":55.8},{"op":"FFN_UP","step_us":55.8},' \
           '{"op":"FFN_UP","step_us":55.8}]' in lines
    assert len(results_json(data, flat_at=0).splitlines()) == 1
    # a Report writes it, numpy-free floats and NaN as json.dumps writes them
    report = Report(timings=[Timing("mk_cycle", "27b.d0", "ctx33", 12.67, 0.01, 16e9, {"nan": math.nan})])
    report.write(tmp_path / "r.json")
    back = json.loads((tmp_path / "r.json").read_text())
    assert back["timings"][0]["median_ms"] == 12.67 and math.isnan(back["timings"][0]["extra"]["nan"])
