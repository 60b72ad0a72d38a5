"""Measuring one point: check against the reference, then time by graph replay; the ceilings and roofline floor."""
