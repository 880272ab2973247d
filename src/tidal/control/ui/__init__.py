"""The dashboard's page, script and style sheet, served by the control plane at /ui."""
