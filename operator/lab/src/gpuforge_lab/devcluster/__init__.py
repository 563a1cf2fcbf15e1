"""gpuforge_lab.devcluster"""
