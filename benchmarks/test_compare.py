"""Self-test of benchmarks/compare.py, sdpa_table.py and transformer_table.py on synthetic inputs, so that their
ratios can be trusted (a ctest test where CMake finds a python3).

Run from the repository root with any python3 (standard library only):

    python3 -m unittest benchmarks/test_compare.py -v
"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import sdpa_table  # noqa: E402
import transformer_table  # noqa: E402


def gbench_rows(name, times, unit="ms", peak=None, aggregates=True):
    """Rows as Google Benchmark 1.7 writes them for `name` run len(times) times with repetitions."""
    def row(suffix, run_type, real_time, aggregate=None):
        r = {"name": name + suffix, "run_name": name, "run_type": run_type, "repetitions": len(times),
             "threads": 1, "iterations": 7, "real_time": real_time, "cpu_time": real_time, "time_unit": unit}
        if aggregate:
            r["aggregate_name"] = aggregate
        if peak is not None:
            r["peak_rss_delta_bytes"] = peak
        return r
    rows = [row("", "iteration", t) for t in times]
    if aggregates:
        ordered = sorted(times)
        rows.append(row("_mean", "aggregate", sum(times) / len(times), "mean"))
        rows.append(row("_median", "aggregate", ordered[len(ordered) // 2], "median"))
        rows.append(row("_stddev", "aggregate", 0.5, "stddev"))
    return rows


def gbench_doc(*row_lists):
    return {"context": {"date": "2024-01-01", "num_cpus": 2},
            "benchmarks": [row for rows in row_lists for row in rows]}


def book_doc(threads, results):
    """A book_reference.py document; results: (case, shape, seconds, peak delta or None)."""
    rows = []
    for case, shape, seconds, peak in results:
        row = {"case": case, "shape": shape, "median_s": seconds, "repetitions_s": [seconds]}
        if peak is not None:
            row["peak_rss_delta_bytes"] = peak
        rows.append(row)
    return {"implementation": "book-python", "threads": threads, "results": rows}


MiB = 2**20


def sample_store():
    """Threads 1: library, composite and book for additive_fwdbwd at mid and big, plus the goal inputs."""
    cpp = gbench_doc(
        gbench_rows("additive_fwdbwd/mid/threads:1", [10.0, 9.0, 50.0], peak=1 * MiB),
        gbench_rows("composite:additive_fwdbwd/mid/threads:1", [350.0, 340.0, 360.0]),
        gbench_rows("additive_fwdbwd/big/threads:1", [0.2, 0.2, 0.2], unit="s", peak=100 * MiB),
        gbench_rows("masked_softmax_fwd/mid/threads:1", [120.0, 120.0, 120.0], unit="us"),
        gbench_rows("softmax_fwd/mid/threads:1", [100.0, 100.0, 100.0], unit="us"),
        gbench_rows("dot_fwd/d2l/threads:1", [21000.0], unit="ns", aggregates=False),
        gbench_rows("dot_parts_fwd/d2l/threads:1", [20000.0], unit="ns", aggregates=False),
        gbench_rows("dot_fwd/toy/threads:1", [5.0], unit="us", aggregates=False),
        gbench_rows("additive_fwd/mid/threads:1", [8.0], aggregates=False),
        gbench_rows("tanh_floor/mid/threads:1", [4.0], aggregates=False),
    )
    book = book_doc(1, [("additive_fwdbwd", "mid", 0.372, 256 * MiB),
                        ("additive_fwdbwd", "big", 6.7, 3400 * MiB),
                        ("dot_fwd", "toy", 150e-6, 0)])
    store = compare.new_store()
    compare.load_cpp(cpp, store)
    compare.load_book(book, store)
    return store


def row_for(rows, case, shape):
    matches = [r for r in rows if r[0] == case and r[1] == shape]
    assert len(matches) == 1, (case, shape, rows)
    return dict(zip(compare.TABLE_HEADER, matches[0]))


class ParseNameTest(unittest.TestCase):
    def test_library_and_composite(self):
        self.assertEqual(compare.parse_name("additive_fwdbwd/mid/threads:1"),
                         ("library", "additive_fwdbwd", "mid", 1))
        self.assertEqual(compare.parse_name("composite:dot_fwd/big/threads:2"),
                         ("composite", "dot_fwd", "big", 2))

    def test_google_benchmark_suffixes_are_ignored(self):
        self.assertEqual(compare.parse_name("dot_fwd/toy/threads:2/repeats:5/real_time"),
                         ("library", "dot_fwd", "toy", 2))

    def test_names_outside_the_convention(self):
        self.assertIsNone(compare.parse_name("BM_Something"))
        self.assertEqual(compare.parse_name("dot_fwd/toy"), ("library", "dot_fwd", "toy", None))


class SummarizeTest(unittest.TestCase):
    def test_median_aggregate_wins_over_mean_and_iterations(self):
        m = compare.summarize(gbench_rows("x/mid/threads:1", [10.0, 9.0, 50.0], peak=1234))
        self.assertAlmostEqual(m.seconds, 10e-3)  # the mean would be 23 ms
        self.assertEqual(m.peak_bytes, 1234)

    def test_iteration_median_without_aggregates(self):
        m = compare.summarize(gbench_rows("x/mid/threads:1", [3.0, 1.0, 2.0], unit="us", aggregates=False))
        self.assertAlmostEqual(m.seconds, 2e-6)
        self.assertIsNone(m.peak_bytes)

    def test_time_units(self):
        for unit, scale in (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
            m = compare.summarize(gbench_rows("x/a", [4.0], unit=unit, aggregates=False))
            self.assertAlmostEqual(m.seconds, 4.0 * scale)

    def test_error_rows_are_skipped(self):
        store = compare.new_store()
        broken = {"name": "dot_fwd/mid/threads:1", "run_type": "iteration", "error_occurred": True,
                  "error_message": "boom", "real_time": 0, "time_unit": "ns"}
        compare.load_cpp({"benchmarks": [broken]}, store)
        self.assertNotIn(("dot_fwd", "mid"), store[1]["library"])


class FormatTest(unittest.TestCase):
    def test_three_significant_digits(self):
        self.assertEqual(compare.three_digits(37.2), "37.2")
        self.assertEqual(compare.three_digits(1.2), "1.20")
        self.assertEqual(compare.three_digits(0.035), "0.0350")
        self.assertEqual(compare.three_digits(372.4), "372")

    def test_units(self):
        self.assertEqual(compare.fmt_time(0.00214), "2.14 ms")
        self.assertEqual(compare.fmt_time(2.5e-6), "2.50 µs")
        self.assertEqual(compare.fmt_time(7.0), "7.00 s")
        self.assertEqual(compare.fmt_time(None), "—")
        self.assertEqual(compare.fmt_bytes(3 * 2**30 + 2**29), "3.50 GiB")
        self.assertEqual(compare.fmt_bytes(0), "0 B")

    def test_ratio_needs_a_positive_denominator(self):
        self.assertIsNone(compare.ratio(1.0, 0))
        self.assertIsNone(compare.ratio(None, 1.0))
        self.assertEqual(compare.fmt_ratio(compare.ratio(0.372, 0.010)), "37.2×")


class TableTest(unittest.TestCase):
    def setUp(self):
        self.rows = compare.table_rows(sample_store()[1])

    def test_times_and_speed_up(self):
        row = row_for(self.rows, "additive_fwdbwd", "mid")
        self.assertEqual(row["library"], "10.0 ms")
        self.assertEqual(row["C++ composite"], "350 ms")
        self.assertEqual(row["book Python"], "372 ms")
        self.assertEqual(row["speed-up book/library"], "37.2×")

    def test_memory_and_its_ratio(self):
        row = row_for(self.rows, "additive_fwdbwd", "mid")
        self.assertEqual(row["peak Δ library"], "1.00 MiB")
        self.assertEqual(row["peak Δ book"], "256 MiB")
        self.assertEqual(row["memory book/library"], "256×")

    def test_missing_cells_are_dashes(self):
        row = row_for(self.rows, "dot_fwd", "toy")
        self.assertEqual(row["C++ composite"], "—")
        self.assertEqual(row["peak Δ library"], "—")
        self.assertEqual(row["memory book/library"], "—")  # book 0 B, library unknown
        self.assertEqual(row["speed-up book/library"], "30.0×")

    def test_floors_are_not_table_rows(self):
        self.assertFalse([r for r in self.rows if r[0] in ("dot_parts_fwd", "tanh_floor")])


class GoalTest(unittest.TestCase):
    def setUp(self):
        self.text = "\n".join(compare.goal_lines(sample_store()[1]))

    def test_masked_over_plain_softmax(self):
        self.assertIn("masked_softmax_fwd / softmax_fwd (library), mid: 120 µs / 100 µs = 1.20×", self.text)
        self.assertIn("masked_softmax_fwd / softmax_fwd (library), big: — / — = —", self.text)

    def test_additive_speed_up_and_memory(self):
        self.assertIn("additive_fwdbwd speed-up book / library, mid: 372 ms / 10.0 ms = 37.2×", self.text)
        self.assertIn("additive_fwdbwd peak memory library / book, big: 100 MiB / 3.32 GiB = 0.0294×",
                      self.text)

    def test_floors_and_toy_overhead(self):
        self.assertIn("dot_parts_fwd (bmm+softmax+bmm), d2l: 21.0 µs / 20.0 µs = 1.05×", self.text)
        self.assertIn("dot_fwd library / book, toy: 5.00 µs / 150 µs = 0.0333×", self.text)
        self.assertIn("additive_fwd library / book, toy: — / — = —", self.text)
        self.assertIn("additive_fwd library / tanh_floor, mid: 8.00 ms / 4.00 ms = 2.00×", self.text)
        self.assertNotIn("tanh_floor, big", self.text)


class RenderTest(unittest.TestCase):
    def test_one_table_per_thread_count(self):
        store = sample_store()
        compare.load_cpp(gbench_doc(gbench_rows("dot_fwd/mid/threads:2", [1.0])), store)
        compare.load_book(book_doc(2, [("dot_fwd", "mid", 0.004, None)]), store)
        text = compare.render(store)
        self.assertEqual(text.count("## threads: "), 2)
        self.assertLess(text.index("## threads: 1"), text.index("## threads: 2"))
        self.assertIn("| dot_fwd | mid | 1.00 ms | — | 4.00 ms | 4.00× |", text)

    def test_speed_up_from_one_to_two_threads(self):
        store = sample_store()
        compare.load_cpp(gbench_doc(
            gbench_rows("additive_fwdbwd/mid/threads:2", [5.0, 6.0, 4.0]),
            gbench_rows("masked_softmax_fwd/mid/threads:2", [80.0], unit="us", aggregates=False),
            gbench_rows("parallel_floor/toy/threads:1", [40.0], unit="ns", aggregates=False),
            gbench_rows("parallel_floor/toy/threads:2", [1.0], unit="us", aggregates=False),
            gbench_rows("softmax_fwd/mid/threads:2", [50.0], unit="us", aggregates=False)), store)
        rows = compare.scaling_rows(store)
        self.assertEqual(rows, [["masked_softmax_fwd", "mid", "120 µs", "80.0 µs", "1.50×"],
                                ["additive_fwdbwd", "mid", "10.0 ms", "5.00 ms", "2.00×"],
                                ["parallel_floor", "toy", "40.0 ns", "1.00 µs", "0.0400×"]])
        text = compare.render(store)
        self.assertIn("## 1 -> 2 threads (library)", text)
        self.assertIn("| additive_fwdbwd | mid | 10.0 ms | 5.00 ms | 2.00× |", text)
        # Not a fused op, nor a case measured at one thread count only.
        section = text.split("## 1 -> 2 threads")[1]
        self.assertNotIn("| softmax_fwd |", section)
        self.assertNotIn("| dot_fwd |", section)

    def test_no_speed_up_section_with_one_thread_count(self):
        self.assertNotIn("1 -> 2 threads", compare.render(sample_store()))

    def test_main_reads_files_and_writes_markdown(self):
        with tempfile.TemporaryDirectory() as tmp:
            cpp, book, out = (os.path.join(tmp, n) for n in ("cpp.json", "book.json", "report.md"))
            with open(cpp, "w") as f:
                json.dump(gbench_doc(gbench_rows("softmax_fwd/big/threads:1", [3.0])), f)
            with open(book, "w") as f:
                json.dump(book_doc(1, [("softmax_fwd", "big", 0.0034, 8 * MiB)]), f)
            compare.main(["--cpp", cpp, "--book", book, "--out", out])
            with open(out) as f:
                text = f.read()
        self.assertIn("| softmax_fwd | big | 3.00 ms | — | 3.40 ms | 1.13× | — | 8.00 MiB | — |", text)
        self.assertIn("Goals:", text)


class HeapPeakTest(unittest.TestCase):
    def test_heap_counter_preferred_over_resident_set(self):
        rows = gbench_rows("additive_fwdbwd/big/threads:1", [2.0, 3.0, 4.0], peak=0)
        for r in rows:
            r["peak_heap_delta_bytes"] = 5 * MiB
        store = new_store_with(rows)
        self.assertEqual(compare.lookup(store[1], "library", "additive_fwdbwd", "big",
                                        "peak_bytes"), 5 * MiB)

    def test_resident_set_where_no_heap_counter(self):
        rows = gbench_rows("additive_fwdbwd/big/threads:1", [2.0, 3.0, 4.0], peak=MiB)
        store = new_store_with(rows)
        self.assertEqual(compare.lookup(store[1], "library", "additive_fwdbwd", "big",
                                        "peak_bytes"), MiB)


def new_store_with(rows):
    store = compare.new_store()
    compare.load_cpp(gbench_doc(rows), store)
    return store


class SdpaTableTest(unittest.TestCase):
    def render(self, heap, unfused=True):
        def rows(case, ms, rss, heap_bytes):
            out = gbench_rows(f"{case}/sdpa512/threads:2", [ms, ms + 1, ms + 2], peak=rss)
            if heap:
                for r in out:
                    r["peak_heap_delta_bytes"] = heap_bytes
            return out
        cases = [rows("dot_fused_noweights_fwd", 2.0, 0, 3 * MiB),
                 rows("sdpa_fwd", 4.0, MiB, 2 * MiB),
                 rows("dot_fused_weights_fwd", 8.0, 0, 9 * MiB)]
        if unfused:
            cases.append(rows("dot_unfused_fwd", 11.0, 0, 12 * MiB))
        doc = gbench_doc(*cases)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sdpa.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                sdpa_table.main([path])
        return text.getvalue()

    def test_medians_ratios_and_exact_heap_peaks(self):
        text = self.render(heap=True)
        self.assertIn("peak heap Δ flash | peak heap Δ SDPA |", text)
        self.assertIn("| 2 | sdpa512 | fwd | 3.00 ms | 5.00 ms | 0.60× | 9.00 ms | 3.00× | 12.00 ms | "
                      "4.00× | 3.0 MiB | 2.0 MiB |", text)

    def test_dashes_where_a_case_did_not_run(self):
        text = self.render(heap=True, unfused=False)
        self.assertIn("| 9.00 ms | 3.00× | — | — | 3.0 MiB |", text)

    def test_resident_set_where_no_heap_counters(self):
        text = self.render(heap=False)
        self.assertIn("peak RSS Δ flash | peak RSS Δ SDPA |", text)
        self.assertIn("| 0.0 MiB | 1.0 MiB |", text)

    def test_bf16_rows_rates_and_both_limits(self):
        def rows(name, ms, counter, flop):
            out = gbench_rows(name, [ms, ms, ms])
            for r in out:
                r[counter] = flop
            return out
        gflop = 1e9
        doc = gbench_doc(rows("dot_fused_noweights_bf16_fwd/sdpa512/threads:1", 2.0, "useful_flop", 0.6 * gflop),
                         rows("sdpa_bf16_fwd/sdpa512/threads:1", 8.0, "useful_flop", 0.6 * gflop),
                         rows("dot_fused_noweights_fwd/sdpa512/threads:1", 3.0, "useful_flop", 0.6 * gflop),
                         rows("fma_peak/limits/threads:1", 10.0, "flop", 2.0 * gflop),
                         rows("dpbf16_peak/limits/threads:1", 10.0, "flop", 4.0 * gflop),
                         rows("mm_fp32/limits/threads:1", 10.0, "flop", 1.0 * gflop),
                         rows("mm_bf16/limits/threads:1", 10.0, "flop", 1.5 * gflop))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sdpa.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                sdpa_table.main([path])
        text = text.getvalue()
        # Peaks 200 and 400 GFLOP/s, mm 100 and 150; ours 0.6 GFLOP in 2 ms = 300 GFLOP/s.
        self.assertIn("float32 FMA peak 200 GFLOP/s; VDPBF16PS peak 400 GFLOP/s; torch::mm 2048² "
                      "at 1 thread: float32 100, bfloat16 150 GFLOP/s.", text)
        self.assertIn("| 1 | sdpa512 | fwd | 2.00 ms | 8.00 ms | 0.25× | 3.00 ms | 1.50× | 300 | "
                      "1.50 | 0.75 | 75 |", text)
        self.assertNotIn("limits |", text)
        # float32: 0.6 GFLOP in 3 ms = 200 GFLOP/s, all of the 200 GFLOP/s peak; SDPA's rate is
        # blank where its float32 row did not run.
        self.assertIn("float32 against the FMA peak (200 GFLOP/s a core):", text)
        self.assertIn("| 1 | sdpa512 | fwd | 3.00 ms | 200 | 1.00 | — |", text)

    def test_shapes_in_order_decoding_last(self):
        names = ["sdpa2048q1", "sdpa512full", "sdpa2048", "sdpa512q1full", "sdpa128", "sdpa512q1",
                 "sdpa8192"]
        self.assertEqual(sorted(names, key=sdpa_table.shape_order),
                         ["sdpa128", "sdpa2048", "sdpa8192", "sdpa512full", "sdpa512q1",
                          "sdpa2048q1", "sdpa512q1full"])


class TransformerTableTest(unittest.TestCase):
    def test_medians_and_ratios_side_by_side(self):
        def rows(name, ms):
            return gbench_rows(f"{name}/threads:1", [ms, ms + 1, ms + 2])
        doc = gbench_doc(rows("causal/full/fwd", 20.0), rows("causal/causal/fwd", 10.0),
                         rows("causal/sdpa_causal/fwd", 40.0), rows("mha/d2l/fwd_bwd", 2.0),
                         rows("mha/torch_nn/fwd_bwd", 3.0), rows("mha/d2l_composite/fwd_bwd", 5.0))
        with tempfile.TemporaryDirectory() as tmp:
            path, out = os.path.join(tmp, "t.json"), os.path.join(tmp, "t.md")
            with open(path, "w") as f:
                json.dump(doc, f)
            medians, _ = transformer_table.read([path])
            self.assertEqual(medians[("causal", "causal", "fwd", 1)], 11.0e-3)
            text = transformer_table.tables(medians)
        # causal / unmasked 11 / 21; is_causal / SDPA 11 / 41; a case that did not run is a dash.
        self.assertIn("| fwd | 21.00 ms | 11.00 ms | – | 0.52 | – | 41.00 ms | 0.27 |", text)
        self.assertIn("| fwd_bwd | 3.00 ms | 6.00 ms | 4.00 ms | 0.75 | 0.50 |", text)


if __name__ == "__main__":
    unittest.main()
