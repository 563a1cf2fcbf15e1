"""gpuforge.sim"""
