"""The polyhedral IR: expressions, kernels, schedules, dependences, isl helpers and names.

Imports nothing else of `poly`: every other part of the poly layer builds on it.
"""
