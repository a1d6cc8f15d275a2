"""Resources lightkube has no model for, defined once for every client: the GpuShare custom
resource and DRA's ResourceClaim, ResourceClaimTemplate, ResourceSlice and DeviceClass."""

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from gpushare.api.gpushare_crd import KIND, PLURAL
from gpushare.api.names import GROUP, VERSION

GpuShareResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
ResourceClaimTemplateResource = create_namespaced_resource(
    DRA_GROUP, DRA_VERSION, "ResourceClaimTemplate", "resourceclaimtemplates"
)
ResourceClaimResource = create_namespaced_resource(
    DRA_GROUP, DRA_VERSION, "ResourceClaim", "resourceclaims"
)
ResourceSliceResource = create_global_resource(
    DRA_GROUP, DRA_VERSION, "ResourceSlice", "resourceslices"
)
DeviceClassResource = create_global_resource(DRA_GROUP, DRA_VERSION, "DeviceClass", "deviceclasses")
