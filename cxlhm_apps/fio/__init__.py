"""cxlhm-fio: fio job files in, fio's text and JSON out, against the emulated device.

Modules, one job each: values (fio's value syntax), options (the option table),
jobfile (INI parsing, inheritance, validation), distributions (random_distribution),
pattern (offsets/sizes/directions per chunk), clocks (wall clock; the model-clock
seam), engines (cxlhm device and raw io_uring), verify (block headers and checksums),
stats (fio's histograms and number formats), runner (threads, files, devices),
report (normal / json / json+), progress (the eta line), compare (real fio side by side).
"""
