"""Device media: the device-DRAM arena and the SSD back end."""
