from pathlib import Path

import dagster as dg

from pipeline.config import Settings


class MiraiSettings(dg.ConfigurableResource):
    """The pipeline's settings (pipeline.config.Settings, read from the environment). Fields set
    here override the environment, which is how tests point a run at a temp directory."""

    data_dir: str | None = None
    gdelt_base_url: str | None = None

    def settings(self) -> Settings:
        overrides: dict[str, object] = {}
        if self.data_dir:
            overrides["data_dir"] = Path(self.data_dir)
        if self.gdelt_base_url:
            overrides["gdelt_base_url"] = self.gdelt_base_url
        return Settings.from_env(**overrides)
