"""What a run is: the registry of its stateful components (TrainState), RNG streams, the
data position (ResumableSampler), how a state becomes files (snapshot), the resume health monitor.
"""
