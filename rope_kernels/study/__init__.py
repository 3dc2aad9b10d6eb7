"""Running the study: devices and provenance, the notebook runner, result files,
reports and the cross-device summary, the offline wheelhouse."""
