"""Resources lightkube has no model for, defined once for every client: the GpuShare custom
resource and DRA's ResourceClaimTemplate."""

from lightkube.generic_resource import create_namespaced_resource

from gpushare.api.gpushare_crd import KIND, PLURAL
from gpushare.api.names import GROUP, VERSION

GpuShareResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

ResourceClaimTemplateResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)
