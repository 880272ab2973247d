"""The API's routes by area, each an :class:`fastapi.APIRouter`; :func:`tidal.control.api.app.create_app`
includes them all."""
