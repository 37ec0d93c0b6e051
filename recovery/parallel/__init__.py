"""Runs of several processes (torchrun): the world and its collectives, sharded state
through DCP, and the save/load protocol across ranks.
"""
