"""Self-test of benchmarks/vit_log_table.py: the last run of an appended log, a resumed run's
epochs joined, and the unfinished and broken cases. Standard library only:

    python3 -m unittest benchmarks/test_vit_log_table.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vit_log_table  # noqa: E402


def epoch(e, of, acc, seconds=10.0):
    return (f"epoch {e}/{of}: train_loss 0.{e}000, val_loss 0.{e}500, val_acc {acc}, "
            f"{seconds} s (50.0 training images/s)\n")


class VitLogTableTest(unittest.TestCase):
    def test_resumed_run_is_one_table(self):
        log = ("Fashion-MNIST from /x\n" + epoch(1, 3, "0.5000") + "  epoch 2 batch 50/469\n"
               "resumed from checkpoint.pt after epoch 1 (val_acc 0.5000)\n"
               + epoch(2, 3, "0.6000") + epoch(3, 3, "0.7000", 12.6) + "final val_acc 0.7000\n")
        text = vit_log_table.table(log)
        self.assertIn("| 2 | 0.2000 | 0.2500 | 0.6000 | 10 |", text)
        self.assertIn("| 3 | 0.3000 | 0.3500 | 0.7000 | 13 |", text)
        self.assertTrue(text.endswith("final val_acc 0.7000 after 3 epochs\n"))

    def test_a_run_started_again_replaces_the_earlier_one(self):
        log = (epoch(1, 2, "0.1111") + epoch(2, 2, "0.2222") + "final val_acc 0.2222\n"
               + epoch(1, 2, "0.3000") + epoch(2, 2, "0.4000") + "final val_acc 0.4000\n")
        text = vit_log_table.table(log)
        self.assertNotIn("0.1111", text)
        self.assertNotIn("0.2222", text)
        self.assertIn("| 1 | 0.1000 | 0.1500 | 0.3000 | 10 |", text)
        self.assertTrue(text.endswith("final val_acc 0.4000 after 2 epochs\n"))

    def test_unfinished_run_says_so(self):
        text = vit_log_table.table(epoch(1, 10, "0.5000") + epoch(2, 10, "0.6000"))
        self.assertTrue(text.endswith("unfinished: 2 of 10 epochs\n"))

    def test_missing_epoch_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "epochs \\[2, 3\\]"):
            vit_log_table.table(epoch(2, 3, "0.5") + epoch(3, 3, "0.6"))
        with self.assertRaisesRegex(ValueError, "no epoch line"):
            vit_log_table.table("final val_acc 0.5\n")


if __name__ == "__main__":
    unittest.main()
