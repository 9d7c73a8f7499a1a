"""Tuning: search the capability's quantization choices for the cheapest config meeting the accuracy goal."""
