"""Self-test of benchmarks/nn_table.py: medians of the repetitions, ratios in real and CPU time,
the goal verdict, and the projections' floor. Standard library only:

    python3 -m unittest benchmarks/test_nn_table.py
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_table  # noqa: E402


def rows(name, real, cpu, unit="ms"):
    return [{"name": name, "run_name": name, "run_type": "iteration", "real_time": r,
             "cpu_time": c, "time_unit": unit} for r, c in zip(real, cpu)]


def table_for(benchmarks):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"context": {"torch_version": "9.9.9", "num_cpus": 2}, "benchmarks": benchmarks}, f)
    try:
        return nn_table.table(f.name)[0]
    finally:
        os.unlink(f.name)


class NnTableTest(unittest.TestCase):
    def test_medians_ratios_and_goal(self):
        base = "nn/mha_small/default/{}/fwd_bwd/threads:1"
        text = table_for(rows(base.format("d2l"), [1.0, 9.0, 2.0], [1.0, 1.0, 1.0])
                         + rows(base.format("torch_nn"), [4.0, 4.0, 40.0], [4.0, 2.0, 4.0])
                         + [{"name": "nn/mha_small/default/d2l/fwd_bwd/threads:1_median",
                             "run_type": "aggregate", "aggregate_name": "median",
                             "real_time": 100.0, "cpu_time": 100.0, "time_unit": "ms"}])
        line = [l for l in text.splitlines() if "E 32, 4 heads, default call" in l][0]
        self.assertIn("| 2 ms / 1 ms | 4 ms / 4 ms | 0.50 | 0.25 | <= 0.6 (met) |", line)
        self.assertIn("LibTorch 9.9.9", text)

    def test_missed_goal_and_floor(self):
        base = "nn/mha_large/default/{}/fwd_bwd/threads:1"
        text = table_for(rows(base.format("d2l"), [0.3], [0.3], unit="s")
                         + rows(base.format("torch_nn"), [0.3], [0.3], unit="s")
                         + rows("nn/mha_large/floor/projections/fwd_bwd/threads:1", [240.0],
                                [240.0]))
        self.assertIn("| 1.00 | 1.00 | <= 0.8 (missed) |", text)
        self.assertIn("240 ms / 240 ms, 0.80 of torch::nn's default call", text)

    def test_a_case_without_its_peer_is_left_out(self):
        text = table_for(rows("nn/encoder6/default/d2l/fwd_bwd/threads:1", [1.0], [1.0])
                         + rows("nn/mha_small/causal/torch_nn/fwd_bwd/threads:1", [1.0], [1.0])
                         + rows("nn/mha_small/causal/d2l/fwd_bwd/threads:1", [1.0], [1.0]))
        self.assertNotIn("TransformerEncoderLayers", text)
        self.assertIn("causal, no weights", text)


if __name__ == "__main__":
    unittest.main()
