"""Checks ncu_sass_summary.py on a hand-made Nsight Compute source-page CSV.

Run: /usr/bin/python3 -m pytest scripts/device/test_ncu_sass_summary.py
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ncu_sass_summary.py")

# The shape `ncu --page source --csv --print-source sass` writes: a preamble, the SASS table
# (sample counts with thousands separators), then another kernel's table that must not count.
CSV = """"Kernel Name","router_gemm_kernel"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_wait"
"0x10","LDG.E R1, [R2]","1,200","1000","900","100"
"0x20","FFMA R3, R1, R1, R3","300","100","0","250"
"0x30","EXIT","0","0","0","0"
"Kernel Name","other_kernel"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_wait"
"0x10","BAR.SYNC","9,999","9999","0","9999"
"""


def run(tmp_path, text, *args):
    path = tmp_path / "sass.csv"
    path.write_text(text)
    return subprocess.run([sys.executable, SCRIPT, str(path), *args], capture_output=True, text=True)


def test_reasons_and_top_instructions(tmp_path):
    r = run(tmp_path, CSV, "--top", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "instructions 3, stall samples 1500"  # the first table only
    # Per-reason totals, largest first; the sampling totals are not reasons.
    assert lines[1].split() == ["stall_long_sb", "900", "60.0", "%"]
    assert lines[2].split() == ["stall_wait", "350", "23.3", "%"]
    assert not any("Not-issued" in line for line in lines)
    # The most-sampled instructions with their top reasons (zero reasons left out).
    assert lines[3].split()[:4] == ["1200", "80.0%", "0x10", "LDG.E"]
    assert lines[3].endswith("long_sb=900, wait=100")
    assert lines[4].endswith("wait=250")
    assert len(lines) == 5


def test_missing_columns_are_an_error(tmp_path):
    r = run(tmp_path, '"Address","Source","Instructions Executed"\n"0x10","EXIT","1"\n')
    assert r.returncode != 0
    assert "Warp Stall Sampling" in r.stderr
    r = run(tmp_path, '"a","b"\n"1","2"\n')
    assert r.returncode != 0
    assert "no SASS table" in r.stderr
