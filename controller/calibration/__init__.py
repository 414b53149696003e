"""Fitting the calibrated profile to traces (offline; `python -m controller.calibration.calibrate`).

    calibrate.py         traces the sample grid and fits the calibrated formula
                         (`controller/estimator/calibration.json`)
    calibrate_hybrid.py  the same for the hybrid families' fits

Never imported at run time: the operator, the webhook and the CLI read the fitted numbers
from calibration.json only. Needs the trace extra.
"""
