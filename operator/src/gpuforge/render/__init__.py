"""gpuforge.render"""
