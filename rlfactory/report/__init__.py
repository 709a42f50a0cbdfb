"""What a run leaves to read (metrics.jsonl and TensorBoard, transcripts and their HTML viewer, the reward curve), and
the run folder they sit in: who owns it while a run writes it, and what replacing it deletes (run_folder.py)."""
