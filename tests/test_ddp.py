"""Two torchrun ranks on CPU (gloo): disjoint DistributedSampler shares, per-epoch shuffles, one shared copy."""
import gc
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet

from .conftest import own_segments


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shm", "mmap"])
def test_two_ranks_see_disjoint_indices_over_one_copy(index_tree, tmp_path, mode):
    pack = tmp_path / "p"
    build_images(scan_imagenet(index_tree), pack, BuildSettings(shard_size=5), ImageSettings(size=32, resize="center-crop", mode="raw"))
    before = own_segments(tmp_path)
    out = tmp_path / "ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(Path(__file__).with_name("ddp_check.py")), str(pack), mode, str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert [x["rank"] for x in ranks] == [0, 1]
    for epoch in range(2):
        a, b = (set(x["epochs"][epoch]) for x in ranks)
        assert not a & b and a | b == set(range(18)) and len(a) == len(b) == 9
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # set_epoch reshuffles
    if mode == "shm":
        assert ranks[0]["segment"] == ranks[1]["segment"] is not None  # one copy on the node
    gc.collect()
    assert own_segments(tmp_path) == before  # the last rank removed it
