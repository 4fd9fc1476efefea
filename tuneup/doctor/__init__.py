"""`tuneup doctor`: facts (probe, readers), knowledge, rules and the report."""
