"""A folder tuneup puts first on ``PYTHONPATH`` of the processes it starts (``tuneup watch``'s
job, ``tuneup autotune``'s trials); only its ``sitecustomize`` is meant to be imported."""
