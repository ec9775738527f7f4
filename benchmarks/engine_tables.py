"""The tables ``bench_engine`` prints from its result: one per stage, one line per row, the
row's figures in one fixed order, its power samples and kernel times below it."""

from __future__ import annotations

# The row fields the printed tables show, in this order (every stage's rows share the list).
PRINTED = (
    "stage", "calls", "total_us", "mean_us", "rows", "product", "linear_us", "addmm_us",
    "tflops", "fraction_of_bound", "batch", "median_ms", "p99_ms", "search_graph_ms",
    "prefill_graph_ms", "replay_wall_ms", "prepare_inputs_wall_ms", "other_ms",
    "roofline_fraction", "products_graph_ms", "products_tflops", "products_share",
    "beyond_products_ms", "target_ms", "target_left_after_products_ms", "triton_ms",
    "torch_ms", "rate_per_s", "mean_batch", "torch_graph_ms", "triton_graph_ms",
    "torch_recommend_ms", "triton_recommend_ms", "graph_ms", "first_call_ms", "new_bucket_ms",
    "wall_us", "wall_minus_graph_us", "device span_us", "check_arguments_us",
    "eager_prepare_inputs_us", "eager_rules_launch_us",
    "replay (lookup, copies, fill, launch, clones)_us", "search_host_us", "verdict read_us",
    "torch_add_us", "torch_full_us", "torch_empty_us", "sync_us", "measured_peak_bytes",
    "estimate_bytes", "failed", "absent")


def print_tables(result: dict) -> None:
    print(f"ceilings: {result['ceilings']}")
    for name, rows in result["stages"].items():
        print(f"\n== {name}")
        for row in rows:
            cells = ", ".join(f"{k}={row[k]:.3f}" if isinstance(row[k], float)
                              else f"{k}={row[k]}" for k in PRINTED if k in row)
            label = row["system"] + (f" {row['kernel']}" if "kernel" in row else "")
            print(f"{label:44s} {cells}")
            for key in ("power", "search_power", "products_power"):
                if row.get(key):
                    print(f"    {key}: " + ", ".join(f"{k} {v:g}" for k, v in row[key].items()))
            if "kernel_ms" in row:
                print("    kernels: " + ", ".join(f"{k} {v:.3f}" for k, v in
                                                  row["kernel_ms"].items()))

