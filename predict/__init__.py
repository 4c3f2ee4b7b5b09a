"""`berth predict`: bulk inference over files on one machine, with the service's own task steps.

    input file --read (streaming, a window of rows at a time)--> rows --prepare (a thread, ahead)--> items
    --plan_batches / run_batch (ONNX Runtime)--> kept outputs --decode--> the routes' result fields
    --> a part file per window (+ its bad rows) --manifest--> at the end, OUTPUT and OUTPUT.errors.jsonl

io.py reads and writes the files, results.py turns a task's results into output rows (and their Parquet
schema), parts.py keeps the resumable parts and their manifest, run.py is the job.
"""
