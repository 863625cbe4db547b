"""The default pair's memory on the default path: loaded in a process of its own, its peak resident memory stays
under the 4 GB a server of the pair is held to (BENCHMARKS.md, "Default path") where prompts are read on the
kernels themselves, and under 5.5 GB where they are read on int8 copies for AMX tiles (measured once on a 2-core
AMX Xeon: 3.5 GB without the copies, 4.8 GB with them). It was 4.2 GB at its peak (the GGUF's mapped pages and the LM
head's float rows held during the load), and 5.2 GB once int8 copies of the weights were built for prompts.

Slow (loads the real pair twice: the first load may still fill the layer cache, the second is what every later
process does); `make test` and CI run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verispec.models.prompt_linear import prompt_format

pytestmark = pytest.mark.slow

# bytes, by the format of the prompt copies the host makes (prompt_linear.prompt_format); other formats are larger
CEILINGS = {"none": 4.0e9, "int8-rows": 5.5e9}
LOAD = """
import json
from verispec import Decoder
from verispec.serve.metrics import resident_memory
decoder = Decoder()
decoder.model("target"), decoder.model("draft")
decoder.build_prompt_copies()  # what a server does before its first request
resident, peak = resident_memory()  # as /metrics reads them: VmRSS and VmHWM (ru_maxrss keeps a forking parent's)
print(json.dumps({"peak": peak, "resident": resident}))
"""


def load_in_a_process() -> dict[str, int]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS and VmHWM in /proc (Linux)")
@pytest.mark.skipif(prompt_format() not in CEILINGS, reason="the default path keeps copies of the weights for "
                    f"prompts on this CPU ({prompt_format()}: 2-4 GB more), as they read prompts faster there")
def test_the_default_pair_loads_within_its_ceiling():
    load_in_a_process()  # fills the caches a first load builds
    memory = load_in_a_process()
    assert memory["resident"] <= memory["peak"] < CEILINGS[prompt_format()], memory
