"""The GpuShare custom resource as lightkube knows it (one definition for every client)."""

from lightkube.generic_resource import create_namespaced_resource

from gpushare.api.gpushare_crd import KIND, PLURAL
from gpushare.api.names import GROUP, VERSION

GpuShareResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
