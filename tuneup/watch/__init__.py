"""``tuneup watch``: samples a training job (NVML, its process tree, the runtime's own
feed) and says why it runs at the speed it does. See docs/watch.md.

Nothing is imported here: the feed (:mod:`tuneup.watch.feed`) is loaded inside training
processes and must stay light.
"""
