"""The memory planner: the seed's arithmetic comes out exactly, packs are read, and it tells fit from no fit."""
from click.testing import CliRunner

from dataprep.bench.plan import MemoryPlan, Part
from dataprep.cli import main


def test_seed_arithmetic_exactly():
    image = Part("image", (512, 512, 3), "uint8", "float32")
    mask = Part("mask", (512, 512), "uint8", "int64")
    p = MemoryPlan([image, mask], batch_size=32, workers=8, prefetch=1)
    assert image.compare_nbytes * 32 == 100_663_296  # a 32 x 512x512x3 float32 batch
    assert mask.compare_nbytes * 32 == 67_108_864  # a 32 x 512x512 int64 mask batch
    assert p.per_batch == 33_554_432  # uint8 for both
    assert p.per_batch_compared == 167_772_160
    assert p.in_flight_compared == 1_342_177_280  # 8 workers x 167 MB = 1.3 GB
    assert p.in_flight == 268_435_456


def test_cache_copies_by_mode_and_fit():
    part = [Part("image", (256, 256, 3), "uint8")]
    ram = MemoryPlan(part, 64, 2, 2, "ram", cache_bytes=10**9, ranks=4, free_ram=3 * 10**9)
    shm = MemoryPlan(part, 64, 2, 2, "shm", cache_bytes=10**9, ranks=4, free_ram=3 * 10**9)
    assert ram.cache_total == 4 * 10**9 and shm.cache_total == 10**9
    assert ram.fits is False and shm.fits is True
    assert MemoryPlan(part, 64, 0, 2).batches_in_flight == 1


def test_cli_prints_the_figures_and_reads_a_pack(index_tree, tmp_path):
    r = CliRunner().invoke(main, ["plan", "--shape", "512x512x3", "--mask-shape", "512x512", "-b", "32", "-w", "8", "--prefetch", "1"])
    assert r.exit_code == 0
    for figure in ("96.0 MiB as float32", "64.0 MiB as int64", "32.0 MiB", "1.2 GiB"):  # the seed's figures, in binary units
        assert figure in r.output
    out = tmp_path / "p"
    assert CliRunner().invoke(main, ["build", "imagenet", str(index_tree), "--out", str(out), "--size", "32",
                                     "--resize", "center-crop", "--mode", "raw", "-j", "1"]).exit_code == 0
    r = CliRunner().invoke(main, ["plan", str(out), "-b", "4", "-w", "2", "--cache", "shm", "--ranks", "2"])
    assert r.exit_code == 0 and "32x32x3" in r.output and "one copy per machine" in r.output
    assert "planned at: the stored shape 32x32x3, which every image has" in r.output
    r = CliRunner().invoke(main, ["plan", str(out), "--cache", "disk"])
    assert r.exit_code == 2 and "disk" in r.output  # an unknown cache mode is a usage error
