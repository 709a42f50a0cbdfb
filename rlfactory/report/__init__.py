"""What a run leaves to read: metrics.jsonl and TensorBoard, transcripts and their HTML viewer, the reward curve."""
