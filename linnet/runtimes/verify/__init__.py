"""`linnet verify`: a source agrees with itself. Every pair of computations its entries promise agree (a decoder's
`forward` against a prefill and decode steps through the KV cache, a batch of two against each row, right-padded
tokens against unpadded, an encoder-decoder's `forward` against its encoder's prefill and decoder steps) is run on
its weights or on seeded random ones and compared within the tolerance of the numerics mode; where two ways part,
the first module whose outputs part is named by checkpoint path.

    report = verify("examples/llama.linnet", preset="smollm2_135m", config={"num_hidden_layers": 2})
    report.agree                       # False where some pair parts
    report.first_part.module.path      # "model.layers.0"
"""

from linnet.runtimes.verify.result import CheckResult, ModulePart, VerifyReport
from linnet.runtimes.verify.runner import BACKENDS, NothingToCompare, verify

__all__ = ["verify", "VerifyReport", "CheckResult", "ModulePart", "NothingToCompare", "BACKENDS"]
