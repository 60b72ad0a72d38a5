"""The timer's L2 flush: by default it reads its whole buffer and writes none of it."""

import pytest
import torch

from moebench._interpret import interpreting
from moebench.measure import timer as timing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and not interpreting(), reason="needs a GPU or TRITON_INTERPRET=1")


@needs_triton
def test_read_flush_reads_every_element_and_writes_none():
    flush = timing.L2Flush(2 * 3000, programs=3, device=DEVICE)  # 3000 elements: not a multiple of the block
    flush()
    # The partial sums of ones count the elements read; the buffer is left as it was (clean lines in L2).
    assert flush.partial.sum().item() == 3000
    assert torch.all(flush.buf == 1)
    assert "a read" in timing.graph_method()


def test_zero_flush_is_the_earlier_fill():
    flush = timing.L2Flush(64, programs=1, device="cpu", mode="zero")
    flush()
    assert flush.partial is None and torch.all(flush.buf == 0) and flush.buf.numel() == 32
    assert "zero fill" in timing.graph_method("zero") and "zero fill" in timing.eager_method("zero")


def test_the_flush_reads_unless_told_otherwise():
    """The default mode, of the flush and of the method named in rows, is the read."""
    flush = timing.L2Flush(64, programs=1, device="cpu")
    assert flush.mode == "read" and flush.partial is not None
    assert "a read" in timing.graph_method() and "a read" in timing.eager_method()


def test_an_unknown_flush_mode_is_refused():
    with pytest.raises(ValueError, match="unknown L2 flush"):
        timing.L2Flush(64, programs=1, device="cpu", mode="write")
    with pytest.raises(ValueError, match="unknown L2 flush"):
        timing.graph_method("write")
