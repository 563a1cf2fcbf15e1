"""gpuforge_lab.sim"""
