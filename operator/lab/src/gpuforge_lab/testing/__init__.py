"""gpuforge_lab.testing"""
