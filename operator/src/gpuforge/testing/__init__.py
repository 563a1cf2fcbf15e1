"""gpuforge.testing"""
