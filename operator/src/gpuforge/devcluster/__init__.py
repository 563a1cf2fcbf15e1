"""gpuforge.devcluster"""
