"""Driver for tests/test_store_failures.py: submit records forever until killed.

Usage: python store_sigkill_driver.py DB_PATH. Prints the run id, then submits ~2,000
records/s, each stamped with the wall-clock time of its submit() in intended_ns.
"""

import sys
import time

import numpy as np

from bench.records import RequestRecord
from bench.store import RunWriter

writer = RunWriter(sys.argv[1], name="sigkill")
writer.start_load_point(0)
print(writer.run_id, flush=True)
i = 0
while True:
    now = time.time_ns()
    t = np.array([10, 20, 30], dtype=np.int64) + now
    writer.submit(
        RequestRecord(
            index=i,
            intended_ns=now,
            sent_ns=now,
            first_token_ns=now + 10,
            end_ns=now + 30,
            chunk_times_ns=t,
            output_tokens=3,
        )
    )
    i += 1
    time.sleep(0.0005)
