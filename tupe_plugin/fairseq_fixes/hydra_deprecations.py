"""No hydra deprecation warnings from fairseq's configuration code.

fairseq 0.12 builds its configuration through hydra APIs that hydra has since deprecated, so every fairseq
command prints about fifty lines of deprecation warnings that no user can act on. They are silenced by
message; every other warning stays.
"""

import warnings

HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header",
    r"\s*'[^']*' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
)

for message in HYDRA_DEPRECATIONS:
    warnings.filterwarnings("ignore", message=message)
